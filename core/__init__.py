"""The decoding engine: an exact MTP speculative lane and a matching autoregressive lane."""
from .acceptance import residual, verify_drafts
from .chat import chat_prompt_ids
from .costs import Costs, DepthPolicy, measure_costs, predicted_speedup
from .decoders import AutoregressiveDecoder, SpeculativeDecoder
from .sampling import NonFiniteLogitsError, SamplerConfig
from .stats import GenerationStats
from .stream import StreamEvent, synchronize

__all__ = [
    "AutoregressiveDecoder", "SpeculativeDecoder", "SamplerConfig", "GenerationStats", "StreamEvent",
    "chat_prompt_ids", "measure_costs", "Costs", "DepthPolicy", "predicted_speedup",
    "NonFiniteLogitsError", "residual", "verify_drafts", "synchronize",
]
