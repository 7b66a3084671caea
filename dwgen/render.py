"""The one Jinja2 environment: turns validated variants into CUDA text (the only importer of jinja2)."""
from __future__ import annotations

import jinja2

from dwgen.space import (
    ANY_TEMPLATE,
    AXES,
    KERNEL_TEMPLATE,
    NVCC_FLAGS,
    TEMPLATE_DIR,
    Variant,
    content_digest,
    violations,
)

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
)

# C++ spellings live here and nowhere else.
_VEC_TYPES = {("fp32", 1): "float", ("fp32", 2): "float2", ("fp32", 4): "float4"}
_INT_RANGE = (-(2**20), 2**20)

ANY_THREADS = 256
ANY_NAME = "dw1d_any_f32"


class RenderError(ValueError):
    """A value that must never reach a template (wrong type, out of range, not an enum member)."""


def _cpp_bool(v: bool) -> str:
    if type(v) is not bool:
        raise RenderError(f"expected a bool, got {v!r}")
    return "true" if v else "false"


def _cpp_int(v: int) -> int:
    if type(v) is not int or not _INT_RANGE[0] <= v <= _INT_RANGE[1]:
        raise RenderError(f"expected an int in {_INT_RANGE}, got {v!r}")
    return v


def _enum(v: str, allowed: tuple) -> str:
    if v not in allowed:
        raise RenderError(f"{v!r} is not one of {allowed}")
    return v


def _identifier(name: str) -> str:
    # Names are built from validated tokens; re-check so that no free text can reach the source.
    if not name.replace("_", "").isalnum() or not name.isascii() or name[0].isdigit():
        raise RenderError(f"{name!r} is not a C identifier")
    return name


def render_variant(v: Variant) -> str:
    """CUDA source of one variant; refuses any variant that breaks a restriction."""
    bad = violations(v.problem, v.config)
    if bad:
        raise RenderError(f"{v.name} breaks {', '.join(bad)}")
    p, c = v.problem, v.config
    ctx = {
        "template": KERNEL_TEMPLATE,
        "name": _identifier(v.name),
        "digest": v.digest,
        "threads": _cpp_int(c.threads),
        "vec": _cpp_int(c.vec),
        "outs": _cpp_int(c.outs),
        "batches": _cpp_int(c.batches),
        "run": _cpp_int(c.run),
        "tile_vectors": _cpp_int(v.tile_vectors),
        "kernel_size": _cpp_int(p.kernel_size),
        "stride": _cpp_int(p.stride),
        "dilation": _cpp_int(p.dilation),
        "stream": _cpp_bool(c.stream),
        "window_vectors": [_cpp_int(v.window_vectors(r)) for r in range(c.vec)],
        "max_window_vectors": _cpp_int(v.max_window_vectors),
        "smem_vectors": _cpp_int(v.smem_vectors),
        "halo": _enum(c.halo, AXES["halo"]),
        "walk": _enum(c.walk, AXES["walk"]),
        "vec_type": _VEC_TYPES[(p.dtype, c.vec)],
        "vec_bytes": _cpp_int(v.align_bytes),
    }
    return _ENV.get_template(KERNEL_TEMPLATE).render(**ctx)


def any_digest() -> str:
    return content_digest({"name": ANY_NAME, "threads": ANY_THREADS, "flags": list(NVCC_FLAGS)}, (ANY_TEMPLATE,))


def render_any() -> str:
    """CUDA source of the generic kernel that is correct for every fp32 problem."""
    return _ENV.get_template(ANY_TEMPLATE).render(
        template=ANY_TEMPLATE, name=ANY_NAME, digest=any_digest(), threads=_cpp_int(ANY_THREADS)
    )


NAIVE_TEMPLATE = "naive.cu.j2"
NAIVE_NAME = "naive_dw1d_f32"


def render_naive() -> tuple[str, str]:
    """Source and digest of the benchmark's naive CUDA contender."""
    digest = content_digest({"name": NAIVE_NAME}, (NAIVE_TEMPLATE,))
    return _ENV.get_template(NAIVE_TEMPLATE).render(template=NAIVE_TEMPLATE, name=NAIVE_NAME, digest=digest), digest


def render_launcher(ctx: dict, digest: str) -> str:
    """Host launchers of the frozen module, one switch case per specialised kernel."""
    for k in ctx["kernels"]:
        _identifier(k["name"])
        for f in ("index", "threads", "vec", "tile_vectors", "batches"):
            _cpp_int(k[f])
        _enum(k["walk"], AXES["walk"])
    _identifier(ctx["any_name"])
    _cpp_int(ctx["any_threads"])
    _cpp_int(ctx["any_max_blocks"])
    return _ENV.get_template(ctx["template"]).render(**ctx, digest=digest)


def render_text(template_source: str, **ctx) -> str:
    """Render a template given as text with the same strict environment (used by tests)."""
    return _ENV.from_string(template_source).render(**ctx)
