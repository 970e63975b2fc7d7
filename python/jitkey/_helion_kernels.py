"""Helion kernels of the DSL benchmark (:mod:`jitkey.dsl_bench`) and the Helion integration's GPU tests.

Module-level functions (Helion takes no closures), each with Helion's default config
(``autotune_effort="none"``): elementwise, scalar arguments, a row reduction, a row softmax, a matmul and a
small attention. Importing this module imports Helion.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch


@helion.kernel(autotune_effort="none")
def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(out.size()):
        out[tile] = x[tile] + y[tile]
    return out


@helion.kernel(autotune_effort="none")
def axpby(x: torch.Tensor, y: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(out.size()):
        out[tile] = x[tile] * alpha + y[tile] * beta
    return out


@helion.kernel(autotune_effort="none")
def row_sum(x: torch.Tensor) -> torch.Tensor:
    m, _ = x.size()
    out = torch.empty([m], dtype=x.dtype, device=x.device)
    for tile_m in hl.tile(m):
        out[tile_m] = x[tile_m, :].sum(-1)
    return out


@helion.kernel(autotune_effort="none")
def softmax(x: torch.Tensor) -> torch.Tensor:
    n, _m = x.size()
    out = torch.empty_like(x)
    for tile_n in hl.tile(n):
        out[tile_n, :] = torch.nn.functional.softmax(x[tile_n, :], dim=1)
    return out


@helion.kernel(autotune_effort="none")
def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    m, k = x.size()
    _, n = y.size()
    out = torch.empty([m, n], dtype=x.dtype, device=x.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, x[tile_m, tile_k], y[tile_k, tile_n])
        out[tile_m, tile_n] = acc.to(x.dtype)
    return out


@helion.kernel(autotune_effort="none")
def attention(q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    m, _d = q.size()
    out = torch.empty_like(q)
    for tile_m in hl.tile(m):
        s = torch.matmul(q[tile_m, :], kt[:, :]) * 0.125
        p = torch.softmax(s.to(torch.float32), dim=-1)
        out[tile_m, :] = torch.matmul(p.to(v.dtype), v[:, :]).to(out.dtype)
    return out
