"""How a benchmark row names its problem, for the table and the chart alike."""
from __future__ import annotations

from dwgen.problem import Problem


def problem_fields(p: Problem) -> dict:
    """What a row says of its problem beside its key (rows written before padding_right and activation were
    Problem fields lack those two; their causal rows carry `causal`, their SiLU ones activation "silu")."""
    return {"shape": f"{p.batch}x{p.channels}x{p.length}", "kernel_size": p.kernel_size, "stride": p.stride,
            "padding": p.padding, "padding_right": p.padding_right, "causal": p.causal and not p.symmetric,
            "dilation": p.dilation, "bias": p.bias, "dtype": p.dtype, "layout": p.layout, "activation": p.activation}


def problem_label(r: dict) -> str:
    if r.get("causal"):
        padding = "causal"
    elif r.get("padding_right", r["padding"]) != r["padding"]:
        padding = f"P{r['padding']}+{r['padding_right']}"
    else:
        padding = f"P{r['padding']}"
    s = f"{r['shape']} {r.get('dtype', 'fp32')}{' (B,L,C)' if r.get('layout') == 'blc' else ''} " \
        f"K{r['kernel_size']} {padding}"
    if r["stride"] != 1:
        s += f" S{r['stride']}"
    if r["dilation"] != 1:
        s += f" D{r['dilation']}"
    if r["bias"]:
        s += " bias"
    if r.get("activation") == "silu":
        s += " SiLU"
    if r.get("backward") or r.get("direction", "fwd") != "fwd":  # a training row says which direction it times
        s += f" {r['direction']}"
    if r.get("timing") == "graph":
        s += " (graph)"
    return s
