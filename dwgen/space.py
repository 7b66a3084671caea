"""The registry of kernel families, and what every variant has whatever its family: name, digest, enumeration."""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from dwgen.dtypes import DTYPES
from dwgen.families import all_designs, bcl, blc, bwd, bwdlane, bwdtc, bwdwalk, lane, tc
from dwgen.problem import ACTIVATIONS, Problem, ProblemError

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
COMMON_TEMPLATE = "_common.cu.j2"
ANY_TEMPLATE = "dw1d_any.cu.j2"

# Flags every variant is compiled with, by nvcc for the search and by the frozen module's build. torch's
# extension build adds the -D flags below to every CUDA file, so the search uses them too: what was timed
# is what ships. They are part of the digest: a change of flags makes every frozen entry stale.
NVCC_FLAGS = ("-O3", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
              "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__")
# Bumped when the way a variant is launched changes: a study's stored timings are only reused under the
# rules they were measured with (it is part of the study name).
LAUNCH_RULES = 3  # 3: every variant launched through the host function its own source defines


@dataclass(frozen=True)
class Family:
    """One kind of kernel, as data: what the search, the freeze and the frozen dispatch iterate over."""

    name: str  # first token of its variants' names
    direction: str  # fwd, or bwd (grad_x, grad_weight and grad_bias together)
    layout: str  # memory order of x and y it reads and writes
    module: ModuleType  # axes, restrictions, geometry, tokens and render context of the family

    @property
    def template(self) -> str:
        return self.module.TEMPLATE

    @property
    def axes(self) -> dict[str, tuple]:
        return self.module.AXES

    @property
    def config_type(self) -> type:
        return self.module.Config

    @property
    def restrictions(self) -> tuple[Callable, ...]:
        return self.module.RESTRICTIONS

    def applies(self, p: Problem) -> bool:
        """Whether any variant of this family can serve p (a module may say so cheaply; else assume it can)."""
        return getattr(self.module, "applies", lambda _: True)(p)

    @property
    def peels_misalignment(self) -> bool:
        """Whether its launch takes an x that starts off a 16-byte boundary (else the dispatcher sends such an x
        to the generic kernels): a family module says so with PEELS_MISALIGNMENT."""
        return getattr(self.module, "PEELS_MISALIGNMENT", False)

    @property
    def sizes_at_run_time(self) -> bool:
        """Whether its launch takes any B, C, L, padding up to the halo a side and bias, as its edge sizes check (a
        family module says so with SIZES_AT_RUN_TIME): the dispatcher may then lend a tuned kernel to an untuned
        problem of the same signature (the lane families take only rows of whole vectors). The gate calls each
        lent kernel with the halo as padding too, which the edge sizes reach only at dilation 1."""
        return getattr(self.module, "SIZES_AT_RUN_TIME", False)

    def activations(self, p: Problem) -> tuple[str, ...]:
        """The activations its launch takes at run time for p (every one unless the module says fewer): what the
        checks run it with besides its problem's own."""
        return getattr(self.module, "activations", lambda _: ACTIVATIONS)(p)

    @property
    def generic_scope(self) -> str | None:
        """Which calls of a (dtype, layout, K) at stride and dilation 1 its launch takes whatever their sizes (a
        module says so with GENERIC_SCOPE): "any" (padding past the halo, every activation) may be a fast
        generic kernel alone; a narrower scope (GENERIC_SCOPES) is chosen beside one, for the calls it admits
        (scope_admits); None never serves as a fast generic kernel."""
        return getattr(self.module, "GENERIC_SCOPE", None)

    def twins(self, config) -> list:
        """Designs a seeded re-tune asks right after a frozen one of this family (a module says so with `twins`):
        the same design on the other side of an axis where neither side wins everywhere, so a re-tune of a few
        trials times both instead of re-timing the frozen design alone (one trial each time, also once the axis is
        old)."""
        return list(getattr(self.module, "twins", lambda _: [])(config))


# Each (direction, layout) has one or more families; the first is its primary one: the generic fast path
# and a tune's plain parameter names are its. The others join a tune where they apply, their parameters
# named `family.axis` beside a `family` choice.
FAMILIES: dict[tuple[str, str], tuple[Family, ...]] = {
    ("fwd", "bcl"): (Family("dw1d", "fwd", "bcl", bcl), Family("dw1d_tc", "fwd", "bcl", tc),
                     Family("dw1d_lane", "fwd", "bcl", lane)),
    ("fwd", "blc"): (Family("dw1d", "fwd", "blc", blc),),
    ("bwd", "bcl"): (Family("dw1d_bwd", "bwd", "bcl", bwd), Family("dw1d_bwdtc", "bwd", "bcl", bwdtc),
                     Family("dw1d_bwdlane", "bwd", "bcl", bwdlane)),
    ("bwd", "blc"): (Family("dw1d_bwd", "bwd", "blc", bwd), Family("dw1d_bwdwalk", "bwd", "blc", bwdwalk)),
}
DIRECTIONS = ("fwd", "bwd")


def direction_key(p: Problem, direction: str = "fwd") -> str:
    """What a tune of p in a direction is named by (its study, its runs folder, its report): the problem's key
    for the forward, with `_bwd` after it for the backward (as the benchmark names its backward rows)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}: choose one of {', '.join(DIRECTIONS)}")
    return p.key if direction == "fwd" else f"{p.key}_{direction}"


def family_of(p: Problem, direction: str = "fwd") -> Family:
    """The primary family of p's direction and layout."""
    return FAMILIES[(direction, p.layout)][0]


def families_of(p: Problem, direction: str = "fwd") -> tuple[Family, ...]:
    """The families that can serve p in a direction, the primary one first (always, to say why not)."""
    primary, *others = FAMILIES[(direction, p.layout)]
    return (primary, *(f for f in others if f.applies(p)))


def family_of_config(p: Problem, config, direction: str = "fwd") -> Family:
    """The family whose config `config` is, among those of p's direction and layout."""
    for f in FAMILIES[(direction, p.layout)]:
        if isinstance(config, f.config_type):
            return f
    raise ValueError(f"{type(config).__name__} is no config of a {direction} {p.layout} family")


def _param_prefix(p: Problem, f: Family, direction: str) -> str:
    """How a tune names f's axes: plainly for the primary family, `family.` before the others'."""
    return "" if f is family_of(p, direction) else f"{f.name}."


def signature(p: Problem) -> dict:
    """The compile-time part of a problem: what a kernel is specialised to (sizes, padding and bias stay run-time)."""
    return {"kernel_size": p.kernel_size, "stride": p.stride, "dilation": p.dilation, "dtype": p.dtype,
            "layout": p.layout}


def signature_tokens(p: Problem, direction: str = "fwd", family: Family | None = None) -> list[str]:
    """The first tokens of a variant's name: its family and what it is specialised to
    (dw1d[_bwd]_f32_k7[_s2][_d2]); the primary family's unless `family` is given."""
    parts = [(family or family_of(p, direction)).name, DTYPES[p.dtype].token, f"k{p.kernel_size}"]
    if p.stride != 1:
        parts.append(f"s{p.stride}")
    if p.dilation != 1:
        parts.append(f"d{p.dilation}")
    return parts


@dataclass(frozen=True)
class Variant:
    """A config specialised to a problem's compile-time parameters (K, stride, dilation, dtype, layout).

    Sizes, padding and bias are run-time arguments, so one variant serves every problem of its signature.
    """

    problem: Problem
    config: object
    direction: str = "fwd"

    @property
    def family(self) -> Family:
        return family_of_config(self.problem, self.config, self.direction)

    @property
    def tiling(self):
        """The family's derived numbers (tile sizes, windows, shared memory) for this problem."""
        return self.family.module.Tiling(self.problem, self.config)

    @property
    def threads(self) -> int:
        return self.config.threads

    @property
    def align_bytes(self) -> int:
        return self.family.module.align_bytes(self.problem, self.config)

    @property
    def channel_multiple(self) -> int:
        return self.family.module.channel_multiple(self.problem, self.config)

    @property
    def name(self) -> str:
        """Short tokens in a fixed order; booleans and defaults appear as a token or not at all."""
        f = self.family
        return "_".join(signature_tokens(self.problem, self.direction, f) + f.module.name_tokens(self.config))

    @property
    def digest(self) -> str:
        return content_digest(
            {"config": self.config.to_dict(), "signature": signature(self.problem), "flags": list(NVCC_FLAGS),
             **({"direction": self.direction} if self.direction != "fwd" else {})},
            (self.family.template, COMMON_TEMPLATE),
        )

    def edge_problems(self) -> list[Problem]:
        """Other problems of this signature that break the family's assumptions (for the correctness gate)."""
        return edge_problems(self.problem, self.family.module.edge_sizes(self.problem, self.config))

    @property
    def config_dict(self) -> dict:
        """The config as make_config reads it back: its axes, and its family's name when not the primary."""
        f = self.family
        primary = f is family_of(self.problem, self.direction)
        return {**self.config.to_dict(), **({} if primary else {"family": f.name})}

    def to_dict(self) -> dict:
        return {"problem": self.problem.to_dict(), "config": self.config_dict, "direction": self.direction}



def edge_problems(p: Problem, sizes) -> list[Problem]:
    """The problems a family's edge sizes (B, C, L, padding, bias) name beside p, those with no output left out.

    A family names each edge's (left) padding; the right one follows the problem: the same as the left for a
    symmetric problem, the problem's own right padding (0 for a causal one) for an asymmetric problem. The
    activation is the problem's."""
    out: list[Problem] = []
    for b, c, n, pad, bias in sizes:
        if n < 1:
            continue
        try:
            q = replace(p, batch=b, channels=c, length=n, padding=pad, bias=bias,
                        padding_right=pad if p.symmetric else p.padding_right)
        except ProblemError:
            continue  # no output at this length with this padding
        if q not in out and q != p:
            out.append(q)
    return out

def make_config(p: Problem, params: dict, direction: str = "fwd"):
    """The config these values make (ValueError when one is off its axis): a config dict of any family of p
    (`family` names one that is not the primary), or a tune's parameters (other families' as `family.axis`)."""
    fams = FAMILIES[(direction, p.layout)]
    name = params.get("family", fams[0].name)
    f = next((f for f in fams if f.name == name), None)
    if f is None:
        names = ", ".join(g.name for g in fams)
        raise ValueError(f"no family {name!r} among the {direction} {p.layout} ones ({names})")
    known = {"family", *f.axes, *fams[0].axes, *(k for g in fams[1:] for k in trial_params_names(g))}
    unknown = set(params) - known
    if unknown:
        raise ValueError(f"unknown axes {sorted(unknown)} for {f.name}")
    prefix = "" if f is fams[0] else f"{f.name}."
    values = {a: params[prefix + a] if prefix + a in params else params[a] for a in f.axes
              if prefix + a in params or a in params}
    return f.config_type(**values)


def trial_params_names(f: Family) -> list[str]:
    return [f"{f.name}.{a}" for a in f.axes]


def trial_params(p: Problem, config, direction: str = "fwd") -> dict:
    """A config as a tune's parameters (make_config's inverse over the tune's distributions)."""
    if len(families_of(p, direction)) == 1:
        return config.to_dict()
    f = family_of_config(p, config, direction)
    prefix = _param_prefix(p, f, direction)
    return {"family": f.name, **{prefix + k: v for k, v in config.to_dict().items()}}


def tune_axes(p: Problem, direction: str = "fwd") -> dict[str, tuple]:
    """Every parameter a tune of p asks, with its values: the primary family's axes, and with several
    families the choice of one and the others' axes as `family.axis`."""
    fams = families_of(p, direction)
    axes = dict(fams[0].axes)
    if len(fams) > 1:
        axes["family"] = tuple(f.name for f in fams)
        for f in fams[1:]:
            axes.update({f"{f.name}.{a}": v for a, v in f.axes.items()})
    return axes


def config_from_name(name: str, problem: Problem, direction: str = "fwd"):
    """The config of a variant name such as dw1d_f32_k7_t128_v4_o2_row_l1 (or, in direction bwd,
    dw1d_bwd_bf16_k3_t128_o16_rawp_b4), which must fit `problem` (a family's name may hold an underscore:
    the longest matching prefix names it)."""
    prefixes = sorted((("_".join(signature_tokens(problem, direction, f)) + "_", f)
                       for f in families_of(problem, direction)), key=lambda pf: -len(pf[0]))
    match = next(((pre, f) for pre, f in prefixes if name.startswith(pre)), None)
    if match is None:
        raise ValueError(f"{name} is not a variant of {problem.key} (expected it to start with {prefixes[-1][0]})")
    pre, f = match
    config = f.module.config_from_tokens(name[len(pre):].split("_"), name)
    canonical = Variant(problem, config, direction).name
    if canonical != name:
        raise ValueError(f"{name} is not a canonical variant name (did you mean {canonical}?)")
    return config


def variant_from_name(name: str, problem: Problem, direction: str = "fwd") -> Variant:
    """The variant a name (as tune.py prints it) gives on `problem`; ValueError as config_from_name."""
    return Variant(problem, config_from_name(name, problem, direction), direction)


def template_text(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text()


_INCLUDE = re.compile(r'{%-?\s*include\s+"([^"]+)"')


def with_includes(templates: tuple[str, ...]) -> list[tuple[str, str]]:
    """(name, text) of the templates and every partial they include, transitively, each once, in the order
    first met: a change to a partial is a change to every variant rendered through it. Each file read once."""
    seen: dict[str, str] = {}

    def visit(t: str) -> None:
        if t not in seen:
            seen[t] = text = template_text(t)
            for inc in _INCLUDE.findall(text):
                visit(inc)

    for t in templates:
        visit(t)
    return list(seen.items())


def content_digest(payload: dict, templates: tuple[str, ...]) -> str:
    """sha256 over a JSON payload and the text of the templates it is rendered from, partials included."""
    h = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    for name, text in with_includes(templates):
        h.update(name.encode())
        h.update(text.encode())
    return h.hexdigest()


def violations(p: Problem, c, direction: str = "fwd") -> list[str]:
    """Names of the restrictions (p, c) breaks; empty when the variant is valid."""
    return [r.__name__ for r in family_of_config(p, c, direction).restrictions if not r(p, c)]


def all_configs(family: Family) -> tuple:
    return all_designs(family.config_type)


def enumerate_space(p: Problem, direction: str = "fwd") -> list[Variant]:
    """Every valid variant for a problem in a direction, in a fixed order."""
    return [Variant(p, c, direction) for f in families_of(p, direction) for c in all_configs(f)
            if not violations(p, c, direction)]


def known_good(p: Problem, direction: str = "fwd") -> list:
    """The family's proven designs that fit p, those with the widest accesses for p's dtype first: a short
    tune asks only the first few, and the 16-bit winners are 16-byte designs listed after the fp32 ones.
    With several families, they take turns."""
    per_family = [sorted((c for c in f.module.KNOWN_GOOD if not violations(p, c, direction)),
                         key=lambda c: -getattr(c, "vec", 0) * p.elem_bytes) for f in families_of(p, direction)]
    # families take turns, so that a short tune asks each family's best designs
    return [c for group in itertools.zip_longest(*per_family) for c in group if c is not None]


# The frozen module's fast path for problems nobody tuned: one kernel per (dtype, layout, K), K 1 to 16, for
# stride 1 and dilation 1 (padding, bias and sizes are run-time). A choice measured by python -m search.generic
# (recorded in the manifest it freezes) wins over the family's default design.
GENERIC_KERNEL_SIZES = tuple(range(1, 17))


def generic_problem(k: int, dtype: str = "fp32", layout: str = "bcl") -> Problem:
    """A stand-in carrying only the signature (K, stride 1, dilation 1) of the generic kernel for K."""
    return Problem(1, 8, 4096, k, 1, (k - 1) // 2, 1, dtype, layout=layout)


def generic_variants(chosen: dict[str, dict] | None = None, direction: str = "fwd") -> list[Variant]:
    """The fast generic kernels of a direction, one per (dtype, layout, K) at stride 1 and dilation 1.
    `chosen` maps a signature key to measured params; a K nobody measured takes the measured design of the
    nearest K of its dtype and layout (the smaller on a tie) that fits it, else the family's default design."""
    chosen = chosen or {}
    out = []
    for (fam_direction, layout), (fam, *_) in FAMILIES.items():  # the primary families only
        if fam_direction != direction:
            continue
        for dtype in DTYPES:
            for k in GENERIC_KERNEL_SIZES:
                p = generic_problem(k, dtype, layout)
                config = _measured_design(chosen, p, direction)
                if config is None:
                    config = fam.module.generic_config(p)
                if violations(p, config, direction):
                    raise ValueError(f"generic kernel {Variant(p, config, direction).name} breaks "
                                     f"{violations(p, config, direction)}")
                out.append(Variant(p, config, direction))
    return out


# The narrower scopes a fast generic kernel may serve beside one of scope "any", narrowest first (the order the
# dispatchers try them in: frozen_dispatch._admits and the launcher's admits say the same in their own terms).
GENERIC_SCOPES = ("causal_or_centred", "left_halo", "within_halo")

# The shortest span (positions a block covers along a row) of a walk backward serving as a fast generic kernel: the
# left_halo scope admits B * ceil(Lout / span) blocks along the grid's second dimension up to 65535 at this span
LEFT_HALO_SPAN = 1024


def scope_admits(scope: str, p: Problem) -> bool:
    """Whether a fast generic kernel of this scope takes p (stride and dilation 1, K <= 16 assumed): within_halo,
    padding up to the halo a side without an activation (the split backward); causal_or_centred, output length L
    with the halo all on the left, or split H // 2 left and the rest right without an activation, on rows of
    whole 16-byte vectors (the lane backward; its launch refuses a batch past 65535 row groups and a row within a
    chunk of 2^31, so those go to the kernel for every call); left_halo, left padding of the halo and any right
    padding, with or without an activation, at most 65535 spans of LEFT_HALO_SPAN positions of output over the
    batch and outputs of at most 2^30 a row (the walk backward over (B, L, C))."""
    left, right = p.paddings
    if scope == "any":
        return True
    if scope == "within_halo":
        return p.activation == "none" and max(left, right) <= p.halo
    if scope == "causal_or_centred":
        return (p.length % (16 // p.elem_bytes) == 0 and p.batch <= 65535 and p.length <= 2**30
                and ((left, right) == (p.halo, 0) or ((left, right) == (p.halo // 2, p.halo - p.halo // 2)
                                                      and p.activation == "none")))
    if scope == "left_halo":
        return (left == p.halo and p.out_length <= 2**30
                and p.batch * -(-p.out_length // LEFT_HALO_SPAN) <= 65535)
    raise ValueError(f"unknown generic scope {scope!r}")


def scope_violations(p: Problem, c, scope: str | None) -> list[str]:
    """What keeps a design from serving its scope's calls as a fast generic kernel beyond the family's own
    restrictions (violations): a walk backward whose blocks cover fewer than LEFT_HALO_SPAN positions, whose grid
    would outgrow what the left_halo rule admits; a lane forward that walks tiles, whose grid's second dimension
    counts a row's chunks (at most 65535: the causal_or_centred rule admits rows of up to 2^30)."""
    if scope == "left_halo" and (span := bwdwalk.Tiling(p, c).span) < LEFT_HALO_SPAN:
        return [f"a span of {span} positions, under the left_halo scope's {LEFT_HALO_SPAN}"]
    if scope == "causal_or_centred" and isinstance(c, lane.Config) and c.walk != "row":
        return ["a tile walk, whose grid counts a row's chunks"]
    return []


def scope_stand_in(p: Problem, scope: str | None) -> Problem:
    """The stand-in a design of a narrower family is specialised to and checked on as a fast generic kernel: a
    call its scope takes, large enough that no size restriction of the family refuses a design (their sizes and
    padding are run-time; the kernel is the same for any of its signature's problems)."""
    if scope == "causal_or_centred":
        return replace(p, batch=16, length=16384, padding=p.halo, padding_right=0)
    if scope == "left_halo":  # channels enough for a block of 64 channel threads of 4-channel vectors
        return replace(p, batch=16, channels=1024, length=16384, padding=p.halo, padding_right=0)
    return p


def narrow_variants(chosen: dict[str, dict] | None, narrow: dict[str, list[dict]],
                    direction: str = "fwd") -> list[list[Variant]]:
    """The fast generic kernels chosen beside a direction's for narrower scopes (search.generic's narrow
    designs, narrowest scope first), a list for each (dtype, layout, K) that has any. `chosen` is as
    generic_variants takes it; `narrow` maps a measured key to its narrow designs. Each scope of each
    (dtype, layout, K) follows its own nearest measurement (nearest_narrow), not the one its generic design
    came from: a K between a measured lane K and a measured split K takes each one's design where it fits."""
    out = []
    for (fam_direction, layout), _ in FAMILIES.items():
        if fam_direction != direction:
            continue
        for dtype in DTYPES:
            for k in GENERIC_KERNEL_SIZES:
                p = generic_problem(k, dtype, layout)
                variants = [v for scope in GENERIC_SCOPES
                            for v in nearest_narrow(chosen or {}, narrow, p, scope, direction)]
                if variants:
                    out.append(variants)
    return out


def nearest_narrow(chosen: dict[str, dict], narrow: dict[str, list[dict]], p: Problem, scope: str,
                   direction: str) -> list[Variant]:
    """The narrow designs of `scope` that p's generic key takes: those of the nearest measured K (the smaller on a
    tie) that weighed the scope, where they fit p (each on its scope's stand-in), else none. A measurement weighed
    the scope where a family of that scope applies at its K; one that could not (the lane backward past K9, the
    split one below K10) is passed over, so that its silence does not hide a farther K's design; one that could
    and chose none stops the walk (the fused design measured faster there)."""
    for k in sorted(GENERIC_KERNEL_SIZES, key=lambda k: (abs(k - p.kernel_size), k)):
        key = generic_choice_key(generic_problem(k, p.dtype, p.layout), direction)
        if not chosen.get(key):
            continue
        q = scope_stand_in(p, scope)
        configs = [make_config(p, params, direction) for params in narrow.get(key, [])]
        fits = [Variant(q, c, direction) for c in configs if family_of_config(p, c, direction).generic_scope == scope
                and not violations(q, c, direction) and not scope_violations(q, c, scope)]
        measured = scope_stand_in(generic_problem(k, p.dtype, p.layout), scope)
        if fits or any(f.generic_scope == scope and f.applies(measured) for f in FAMILIES[(direction, p.layout)]):
            return fits
    return []


def _measured_source(chosen: dict[str, dict], p: Problem, direction: str) -> str | None:
    """The key of p's own measured design, else of the nearest measured K's (same dtype and layout) whose
    design fits p."""
    nearest = sorted(GENERIC_KERNEL_SIZES, key=lambda k: (abs(k - p.kernel_size), k))
    for k in nearest:
        key = generic_choice_key(generic_problem(k, p.dtype, p.layout), direction)
        if chosen.get(key) and (k == p.kernel_size or not violations(p, make_config(p, chosen[key], direction),
                                                                     direction)):
            return key
    return None


def _measured_design(chosen: dict[str, dict], p: Problem, direction: str):
    """p's own measured design, else the nearest measured K's (same dtype and layout) where it fits p. A design
    may be of any family of the layout (its config names the family when it is not the primary one)."""
    key = _measured_source(chosen, p, direction)
    return None if key is None else make_config(p, chosen[key], direction)


def generic_key(p: Problem) -> str:
    """What a generic kernel is looked up by: dtype, layout, K."""
    return f"{p.dtype}_{p.layout}_k{p.kernel_size}"


def generic_choice_key(p: Problem, direction: str = "fwd") -> str:
    """What a measured generic design is kept under (the manifest's generic choices): generic_key for the
    forward, with `_bwd` after it for the backward."""
    return generic_key(p) + ("_bwd" if direction == "bwd" else "")
