"""Helion kernels of the DSL layer's differential tests (module level: Helion takes no closures)."""

from __future__ import annotations

from collections.abc import Callable

import helion
import helion.language as hl
import torch


@helion.kernel(autotune_effort="none")
def add_bcast(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, n = x.size()
    out = torch.empty([m, n], dtype=torch.promote_types(x.dtype, b.dtype), device=x.device)
    for tile_m, tile_n in hl.tile([m, n]):
        out[tile_m, tile_n] = x[tile_m, tile_n] + b[tile_n]
    return out


@helion.kernel(autotune_effort="none")
def add_inplace(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    for tile in hl.tile(x.size()):
        x[tile] = x[tile] + y[tile]
    return x


@helion.kernel(autotune_effort="none")
def add_out(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    for tile in hl.tile(out.size()):
        out[tile] = x[tile] + y[tile]
    return out


@helion.kernel(autotune_effort="none")
def scale_shift(x: torch.Tensor, scale: float, shift: int) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(out.size()):
        out[tile] = x[tile] * scale + shift
    return out


@helion.kernel(autotune_effort="none")
def col_sum(x: torch.Tensor) -> torch.Tensor:
    _m, n = x.size()
    out = torch.empty([n], dtype=torch.float32, device=x.device)
    for tile_n in hl.tile(n):
        out[tile_n] = x[:, tile_n].to(torch.float32).sum(0)
    return out


@helion.kernel(autotune_effort="none")
def add_epilogue(
    x: torch.Tensor,
    y: torch.Tensor,
    epilogue: Callable[[torch.Tensor, tuple[torch.Tensor, ...]], torch.Tensor] = lambda acc, tile: acc * 2,
) -> torch.Tensor:
    # A function default, as Helion's matmul examples take epilogues: jitkey cannot key it, Helion runs it.
    out = torch.empty_like(x)
    for tile in hl.tile(out.size()):
        out[tile] = epilogue(x[tile] + y[tile], (tile,))
    return out
