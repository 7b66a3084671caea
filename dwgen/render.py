"""The one Jinja2 environment: turns validated variants into CUDA text (the only importer of jinja2)."""
from __future__ import annotations

import re

import jinja2

from dwgen import contract
from dwgen.dtypes import DTYPES, DType
from dwgen.space import ANY_TEMPLATE, COMMON_TEMPLATE, NVCC_FLAGS, TEMPLATE_DIR, Variant, content_digest, violations

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
)

_INT_RANGE = (-(2**20), 2**20)
# Fields that hold the context of a kernel a family renders inside its own (the split backward's grad_x):
# validated as a context themselves; a dict anywhere else is refused.
_NESTED_CONTEXTS = ("gx",)
_TOKEN = re.compile(r"^[a-z0-9_]{1,32}$")

ANY_THREADS = 256
ANY_MAX_BLOCKS = 1 << 20
# The generic row kernel's shared memory, in floats: a 1024-output tile's span at stride 4 with (K - 1) * D up to
# about 2000, and its weights (24 KB: nine 256-thread blocks an SM still fit)
ANY_SMEM_FLOATS = 6144
# The generic row kernels' blocks, at least, where a problem's tiles allow (about two waves of 256-thread blocks on
# an H200); past that each block walks several tiles of one row, paying its fixed work once for them.
ANY_ROW_BLOCKS = 2048
NAIVE_TEMPLATE = "naive.cu.j2"
BWD_ANY_TEMPLATE = "dw1d_bwd_any.cu.j2"
WINDOW_TEMPLATE = "_window.cu.j2"  # what both generic row kernels share (span bounds, window, store)
# The generic backward's numbers: threads a block; grad_weight taps one pass over a chunk keeps in registers;
# the reduction's chunking (at least BWD_ANY_MIN_CHUNK outputs of a channel a block, and chunks only until
# BWD_ANY_TARGET_BLOCKS blocks: about two waves of 256-thread blocks on an H200, few partials to sum).
BWD_ANY_THREADS = 256
BWD_ANY_TAPS = 8
BWD_ANY_MIN_CHUNK = 4096
BWD_ANY_TARGET_BLOCKS = 2048


class RenderError(ValueError):
    """A value that must never reach a template (wrong type, out of range, not an enum member)."""


class CppBool:
    """A family's bool as a template sees it: printed, its C++ spelling (true, false); tested by {% if %}, its
    value (a plain "false" string would be true there, which once rendered every split backward with the
    tensor-core weight gradient)."""

    __slots__ = ("value",)

    def __init__(self, value: bool):
        self.value = value

    def __bool__(self) -> bool:
        return self.value

    def __str__(self) -> str:
        return "true" if self.value else "false"


def _cpp_bool(v: bool) -> CppBool:
    if type(v) is not bool:
        raise RenderError(f"expected a bool, got {v!r}")
    return CppBool(v)


def _cpp_int(v: int) -> int:
    if type(v) is not int or not _INT_RANGE[0] <= v <= _INT_RANGE[1]:
        raise RenderError(f"expected an int in {_INT_RANGE}, got {v!r}")
    return v


def _token(v: str) -> str:
    if type(v) is not str or not _TOKEN.match(v):
        raise RenderError(f"{v!r} is not a plain token")
    return v


def _identifier(name: str) -> str:
    # Names are built from validated tokens; re-check so that no free text can reach the source.
    if type(name) is not str or not name.replace("_", "").isalnum() or not name.isascii() or name[0].isdigit():
        raise RenderError(f"{name!r} is not a C identifier")
    return name


def _validated(ctx: dict) -> dict:
    """Every family value as the template may see it: ints in range, bools as C++, tokens, lists of ints, and
    the context of a kernel a family renders inside its own (a dict, validated the same way)."""
    out = {}
    for key, v in ctx.items():
        if type(v) is dict and key in _NESTED_CONTEXTS:
            out[key] = _validated(v)
        elif type(v) is bool:
            out[key] = _cpp_bool(v)
        elif type(v) is int:
            out[key] = _cpp_int(v)
        elif type(v) is list:
            out[key] = [_cpp_int(x) for x in v]
        else:
            out[key] = _token(v)
    return out


def _dtype_context(d: DType) -> dict:
    """C++ spellings of an element type, from the one dtype table."""
    return {"storage": d.storage, "scalar_bits": d.bits, "dtype_header": d.header, "to_float": d.to_float,
            "from_float": d.from_float}


def _generic_context(d: DType) -> dict:
    """An element type's spellings for the generic kernels: _common.cu.j2's helpers at one element a vector."""
    return {**_dtype_context(d), "vec_type": d.vector_type(1)}


def render_variant(v: Variant) -> str:
    """CUDA source of one variant (kernel and its host launch function); refuses any invalid variant."""
    bad = violations(v.problem, v.config, v.direction)
    if bad:
        raise RenderError(f"{v.name} breaks {', '.join(bad)}")
    return render_family(v.family.template, v.family.module.render_context(v.problem, v.config), v.problem.dtype,
                         v.name, v.digest, v.family.direction)


def render_family(template: str, family_ctx: dict, dtype: str, name: str, digest: str, direction: str = "fwd") -> str:
    """CUDA source of a family template from its family's render context (validated here), element type,
    name and digest; render_variant's body, open to a family not (yet) in the registry."""
    d = DTYPES[dtype]
    family_ctx = _validated(family_ctx)
    ctx = {
        **family_ctx,
        **_dtype_context(d),
        "template": template,
        "name": _identifier(name),
        "digest": digest,
        "vec_type": d.vector_type(family_ctx["vec"]),
        "launch_params": contract.cpp_params(direction),
        "fwd_launch_params": contract.cpp_params("fwd"),  # for a forward kernel a backward launches
    }
    return _ENV.get_template(template).render(**ctx)


def any_name(dtype: str) -> str:
    return f"dw1d_any_{DTYPES[dtype].token}"


def any_digest(dtype: str) -> str:
    return content_digest({"name": any_name(dtype), "threads": ANY_THREADS, "max_blocks": ANY_MAX_BLOCKS,
                           "smem_floats": ANY_SMEM_FLOATS, "row_blocks": ANY_ROW_BLOCKS, "flags": list(NVCC_FLAGS)},
                          (ANY_TEMPLATE, COMMON_TEMPLATE, WINDOW_TEMPLATE))


def render_any(dtype: str) -> str:
    """CUDA source of the generic kernel that is correct for every problem of one element type, any layout."""
    return _ENV.get_template(ANY_TEMPLATE).render(
        template=ANY_TEMPLATE, name=any_name(dtype), digest=any_digest(dtype), threads=_cpp_int(ANY_THREADS),
        max_blocks=_cpp_int(ANY_MAX_BLOCKS), smem_floats=_cpp_int(ANY_SMEM_FLOATS), row_blocks=_cpp_int(ANY_ROW_BLOCKS),
        **_generic_context(DTYPES[dtype]))


def _bwd_any_numbers() -> dict:
    return {"threads": BWD_ANY_THREADS, "taps": BWD_ANY_TAPS, "max_blocks": ANY_MAX_BLOCKS,
            "min_chunk": BWD_ANY_MIN_CHUNK, "target_blocks": BWD_ANY_TARGET_BLOCKS, "smem_floats": ANY_SMEM_FLOATS,
            "row_blocks": ANY_ROW_BLOCKS}


def bwd_any_name(dtype: str) -> str:
    return f"dw1d_bwd_any_{DTYPES[dtype].token}"


def bwd_any_digest(dtype: str) -> str:
    return content_digest({"name": bwd_any_name(dtype), **_bwd_any_numbers(), "flags": list(NVCC_FLAGS)},
                          (BWD_ANY_TEMPLATE, COMMON_TEMPLATE, WINDOW_TEMPLATE))


def render_bwd_any(dtype: str) -> str:
    """CUDA source of the generic backward (grad_x, grad_weight, grad_bias) for every problem of one element type."""
    numbers = {k: _cpp_int(v) for k, v in _bwd_any_numbers().items()}
    return _ENV.get_template(BWD_ANY_TEMPLATE).render(
        template=BWD_ANY_TEMPLATE, name=bwd_any_name(dtype), digest=bwd_any_digest(dtype), **numbers,
        **_generic_context(DTYPES[dtype]))


def naive_name(dtype: str) -> str:
    return f"naive_dw1d_{DTYPES[dtype].token}"


def render_naive(dtype: str = "fp32") -> tuple[str, str]:
    """Source and digest of the benchmark's naive CUDA contender."""
    name = naive_name(dtype)
    digest = content_digest({"name": name, "flags": list(NVCC_FLAGS)}, (NAIVE_TEMPLATE,))
    src = _ENV.get_template(NAIVE_TEMPLATE).render(template=NAIVE_TEMPLATE, name=name, digest=digest,
                                                   **_dtype_context(DTYPES[dtype]))
    return src, digest


def render_launcher(ctx: dict, digest: str) -> str:
    """The frozen module's dispatcher: a table of the kernels' launch functions and the generic launchers."""
    for k in ctx["kernels"]:
        _identifier(k["name"])
        _cpp_int(k["index"])
        if k["direction"] not in ("fwd", "bwd"):
            raise RenderError(f"{k['direction']!r} is not a direction")
    for name in [*ctx["any_names"].values(), *ctx["bwd_any_names"].values()]:
        _identifier(name)
    scalar_types = {name: d.aten_scalar for name, d in DTYPES.items()}
    return _ENV.get_template(ctx["template"]).render(**ctx, digest=digest, launch_types=contract.cpp_types(),
                                                     bwd_launch_types=contract.cpp_types("bwd"),
                                                     scalar_types=scalar_types)


def render_text(template_source: str, **ctx) -> str:
    """Render a template given as text with the same strict environment (used by tests)."""
    return _ENV.from_string(template_source).render(**ctx)
