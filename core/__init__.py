"""The decoding engine: an exact MTP speculative lane and a matching autoregressive lane."""
from .acceptance import residual, verify_drafts
from .constraints import Constraint, GrammarError, prepare_tokenizer
from .chat import chat_prompt, chat_prompt_ids, history_prompt, padded_chat_prompt
from .limits import ContextError, FittedPrompt, InputTooLarge, context_window, fit_chat
from .prefix_cache import PrefixCache
from .reasoning import THINK, THOUGHT_CHANNEL, Markers, ThinkSplitter, markers_for, opens_thinking, split_reply
from .costs import Costs, DepthPolicy, predicted_speedup
from .decoders import AutoregressiveDecoder, SpeculativeDecoder
from .calibrate import measure_costs
from .model import Adapter, State
from .sampling import NonFiniteLogitsError, SamplerConfig
from .logprobs import TokenLogprob, prompt_logprobs
from .stats import GenerationStats
from .stream import PrefillStopped, Prompt, StreamEvent, synchronize

__all__ = [
    "AutoregressiveDecoder", "SpeculativeDecoder", "SamplerConfig", "GenerationStats", "StreamEvent",
    "chat_prompt_ids", "measure_costs", "Costs", "DepthPolicy", "predicted_speedup",
    "NonFiniteLogitsError", "residual", "verify_drafts", "synchronize", "Prompt", "PrefixCache", "PrefillStopped",
    "chat_prompt", "history_prompt", "padded_chat_prompt", "ContextError", "InputTooLarge", "FittedPrompt", "fit_chat",
    "context_window", "ThinkSplitter", "opens_thinking", "split_reply", "Markers", "markers_for", "THINK",
    "THOUGHT_CHANNEL", "Adapter", "State",
    "Constraint", "GrammarError", "prepare_tokenizer", "TokenLogprob", "prompt_logprobs",
]
