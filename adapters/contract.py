"""What the engine needs to know about a checkpoint's MTP head, with nothing left to guess."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

HiddenVariant = Literal["pre_norm", "post_norm"]
ConcatOrder = Literal["embedding_hidden", "hidden_embedding"]
NormConvention = Literal["zero_centered", "standard"]


@dataclass(frozen=True)
class MTPContract:
    hidden_size: int
    vocab_size: int
    num_layers: int  # trunk layers
    layer_kinds: tuple  # "linear" (Gated-DeltaNet) or "full" (attention), one per trunk layer
    mtp_num_layers: int
    hidden_variant: HiddenVariant  # which trunk hidden state feeds the head
    concat_order: ConcatOrder  # order of [embedding, hidden] before fc
    norm_convention: NormConvention  # how the sidecar stores its RMSNorm weights
    norm_convention_source: str  # "config" or "detected (...)": how it was decided
    hidden_variant_source: str
    trunk_quantization: Optional[dict]  # {"bits", "group_size"} or None (float trunk)
    mtp_quantization: Optional[dict]  # bits/group_size of the sidecar linears, None if float
    mtp_tensor_count: int
    sidecar: str  # where the head was found: the sidecar's path relative to the checkpoint, or "mtp.* in <shards>"
    family: str = "qwen3_5"
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    layout: str = "mlx + sidecar"  # or "Hugging Face" (the original checkpoint, mtp.* in its shards)

    def summary(self) -> str:
        kinds = "".join("L" if k == "linear" else "A" for k in self.layer_kinds)
        return (
            f"MTPContract(hidden_size={self.hidden_size}, vocab_size={self.vocab_size}, "
            f"num_layers={self.num_layers} [{kinds}: "
            f"{self.layer_kinds.count('linear')} Gated-DeltaNet + {self.layer_kinds.count('full')} attention], "
            f"mtp_num_layers={self.mtp_num_layers}, hidden_variant='{self.hidden_variant}' ({self.hidden_variant_source}), "
            f"concat_order='{self.concat_order}', norm_convention='{self.norm_convention}' ({self.norm_convention_source}), "
            f"trunk_quantization={self.trunk_quantization}, mtp_quantization={self.mtp_quantization}, "
            f"mtp_tensors={self.mtp_tensor_count}, sidecar='{self.sidecar}', family='{self.family}', "
            f"num_experts={self.num_experts}, layout='{self.layout}')"
        )
