"""How a benchmark row names its problem, for the table and the chart alike."""
from __future__ import annotations


def problem_label(r: dict) -> str:
    s = f"{r['shape']} {r.get('dtype', 'fp32')}{' (B,L,C)' if r.get('layout') == 'blc' else ''} " \
        f"K{r['kernel_size']} P{r['padding']}"
    if r["stride"] != 1:
        s += f" S{r['stride']}"
    if r["dilation"] != 1:
        s += f" D{r['dilation']}"
    if r["bias"]:
        s += " bias"
    if r.get("timing") == "graph":
        s += " (graph)"
    return s
