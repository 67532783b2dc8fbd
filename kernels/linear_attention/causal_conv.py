"""The causal depthwise convolution in front of a GDN layer's delta rule, over a state per sequence: the
last ``kernel - 1`` inputs of each channel, so that a chunk or a decode token continues where the sequence
left off. ``conv_ref`` is one sequence's convolution with its state as left padding (zeros for a fresh
sequence, as transformers pads); ``conv_step`` is one token of a batch of decoding sequences."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def conv_ref(x: torch.Tensor, weight: torch.Tensor, state: Optional[torch.Tensor] = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, C], weight [C, K], state [C, K - 1] or None: SiLU of the convolution [T, C], and the new state."""
    c, kernel = weight.shape
    prefix = x.new_zeros(c, kernel - 1) if state is None else state.to(x.dtype)
    full = torch.cat([prefix, x.t()], dim=1)
    out = F.conv1d(full[None], weight[:, None, :].to(x.dtype), groups=c)[0]
    return F.silu(out).t(), full[:, full.shape[1] - (kernel - 1):]


def conv_step(x: torch.Tensor, weight: torch.Tensor, states: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """x [B, C], one token of each of B sequences whose states are rows ``slots`` of ``states`` [S, C, K - 1],
    advanced in place. Returns SiLU of the convolution [B, C]."""
    window = torch.cat([states.index_select(0, slots).to(x.dtype), x[:, :, None]], dim=2)  # [B, C, K]
    states.index_copy_(0, slots, window[:, :, 1:].to(states.dtype))
    return F.silu((window * weight.to(x.dtype)[None]).sum(-1))
