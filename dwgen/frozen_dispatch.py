"""Frozen dwgen kernels: depthwise_conv1d, tuned for the problems in manifest.json, generic elsewhere.

Written by dwgen's freeze step (from dwgen/frozen_dispatch.py); do not edit. Needs only torch, plus nvcc
and ninja for the first build, which compiles the kernel sources a few to a unit, the units in parallel, and
which torch caches by content.
"""
from __future__ import annotations

import hashlib
import heapq
import json
import os
import re
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

SCHEMA = 4  # dwgen.freeze.SCHEMA, repeated because this module imports only torch (a test checks they agree)
_HERE = Path(__file__).resolve().parent
# What a tuned entry is looked up by (the C++ tables' tuned_key in this order). Entries written before a
# problem had padding_right and activation read as symmetric with none (_entry_key).
_KEY_FIELDS = ("batch", "channels", "length", "kernel_size", "stride", "padding", "padding_right", "dilation",
               "dtype", "bias", "layout", "activation")
_ACTIVATION_NAMES = ("none", "silu")  # dwgen.problem.ACTIVATIONS; index = the op's activation argument
_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_LAYOUTS = ("bcl", "blc")
_INT32_LIMIT = 2**31
# What the manifest may hold: only these shapes of values reach a file path, the compiler's command line or
# the dispatch tables; anything else is refused, never run.
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[a-z][a-z0-9_]{0,127}")
_KERNEL_FILE = re.compile(r"kernels/[a-z0-9_]{1,128}-[0-9a-f]{12}\.cu")
_LAUNCH_FILE = re.compile(r"launch-[0-9a-f]{12}\.cpp")
_FLAG = re.compile(r"-{1,2}[A-Za-z0-9_][A-Za-z0-9_=.+-]{0,63}")
_CAPABILITY = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")
_TABLE_ROW = re.compile(r"^ {4}ENTRY_(?:FWD|BWD)\(([a-z0-9_]+)\),  // ([0-9]+)$", re.M)
_DECLARATION = re.compile(r"^int dwgen_launch_([a-z0-9_]+)\(([^()\n]*)\);$", re.M)
_WORKSPACE = re.compile(r"^long long dwgen_workspace_([a-z0-9_]+)\(([^()\n]*)\);$", re.M)
_FAST_KEY = re.compile(r"(fp32|fp16|bf16)_(bcl|blc)_k([1-9]|1[0-6])")
FAST_MAX_K = 16  # the fast generic kernels' reach: K 1 to 16 at stride and dilation 1 (the launcher's MAX_K)
_ARG_LIMIT = 2**31 - 1  # the kernels take stride, dilation and each padding as 32-bit ints
# What a tuned kernel is lent by to untuned problems (the C++ tables' lent_key in this order)
_SIGNATURE_FIELDS = ("kernel_size", "stride", "dilation", "dtype", "layout", "activation")
_DIRECTIONS = ("fwd", "bwd")
# The manifest's fast generic tables, each a direction's: dtype_layout_kK -> the kernel that serves every call,
# or (narrow) -> the kernels chosen beside it for the calls their scope admits, narrowest scope first
_FAST_TABLES = {"fast": ("fwd", False), "fast_bwd": ("bwd", False), "fast_narrow": ("fwd", True),
                "fast_bwd_narrow": ("bwd", True)}
_MAX_NARROW = 2  # narrow kernels a key (the launcher's MAX_NARROW)
# The families whose kernels serve only some calls as fast generic kernels, and which (space.GENERIC_SCOPES,
# space.scope_admits; the launcher's scope numbers are the order of _SCOPES)
_NARROW_SCOPES = {"dw1d_bwdtc": "within_halo", "dw1d_lane": "causal_or_centred", "dw1d_bwdlane": "causal_or_centred",
                  "dw1d_bwdwalk": "left_halo"}
_SCOPES = ("any", "within_halo", "causal_or_centred", "left_halo")
_LEFT_HALO_SPAN = 1024  # space.LEFT_HALO_SPAN


class ManifestError(ValueError):
    """manifest.json cannot be used at all: the module imports, and its first call says why."""


def _is_int(v, low: int = 0) -> bool:
    return type(v) is int and low <= v < 2**62


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _file_record(r, pattern: re.Pattern) -> bool:
    return (isinstance(r, dict) and isinstance(r.get("name"), str) and _NAME.fullmatch(r["name"]) is not None
            and isinstance(r.get("file"), str) and pattern.fullmatch(r["file"]) is not None
            and isinstance(r.get("sha256"), str) and _HEX64.fullmatch(r["sha256"]) is not None)


def check_manifest(m) -> None:
    """Raise ManifestError when the manifest as a whole cannot be trusted (one bad kernel or entry is only
    dropped, by _trusted): wrong schema, missing parts, flags or file names that are not plain."""
    if not isinstance(m, dict):
        raise ManifestError("is not a JSON object")
    if m.get("schema") != SCHEMA:
        raise ManifestError(f"has schema {m.get('schema')!r}, this module reads schema {SCHEMA}")
    flags = m.get("nvcc_flags")
    if not isinstance(flags, list) or not all(isinstance(f, str) and _FLAG.fullmatch(f) for f in flags):
        raise ManifestError(f"has nvcc_flags that are not plain compiler flags: {flags!r}")
    if not (isinstance(m.get("launcher"), str) and _LAUNCH_FILE.fullmatch(m["launcher"])
            and isinstance(m.get("launcher_sha256"), str) and _HEX64.fullmatch(m["launcher_sha256"])):
        raise ManifestError("has no valid launcher file name and sha256")
    generic = m.get("generic")
    for part in ("scalar", "scalar_bwd"):
        scalar = generic.get(part) if isinstance(generic, dict) else None
        if not isinstance(scalar, dict) or sorted(scalar) != sorted(_DTYPES.values()) or not all(
                _file_record(r, _KERNEL_FILE) for r in scalar.values()):
            raise ManifestError(f"has no valid generic {part} kernel records for fp32, fp16 and bf16")
    for part, (_, narrow) in _FAST_TABLES.items():  # the narrow tables may be absent (manifests written before them)
        fast = generic.get(part, {} if narrow else None)
        if not isinstance(fast, dict) or not all(
                isinstance(k, str) and _FAST_KEY.fullmatch(k) and (
                    isinstance(v, list) and 0 < len(v) <= _MAX_NARROW and all(isinstance(n, str) for n in v)
                    if narrow else isinstance(v, str)) for k, v in fast.items()):
            raise ManifestError(f"has a generic {part!r} table that is not a map of "
                                f"{f'lists of at most {_MAX_NARROW} names' if narrow else 'names'}")
    if not isinstance(m.get("kernels"), list) or not isinstance(m.get("entries"), list):
        raise ManifestError("has no kernels or entries list")


def _kernel_problem(k) -> str | None:
    """Why a kernel record cannot be used, or None."""
    if not _file_record(k, _KERNEL_FILE):
        return "its name, file or sha256 is not plain"
    if not (_is_int(k.get("align_bytes"), 1) and k["align_bytes"] <= 16 and _is_int(k.get("channel_multiple"), 1)
            and k["channel_multiple"] <= 64 and type(k.get("peels_misalignment")) is bool
            and type(k.get("sizes_at_run_time")) is bool):
        return "align_bytes, channel_multiple, peels_misalignment or sizes_at_run_time has the wrong type or range"
    if k.get("direction") not in _DIRECTIONS:
        return "its direction is not fwd or bwd"
    if not isinstance(k.get("config"), dict) or not isinstance(k.get("signature"), dict):
        return "its config or signature is not a record"  # the fast tables' and the dispatch's rules read both
    return None


def _entry_problem(e) -> str | None:
    """Why a tuned entry cannot be used, or None."""
    if not isinstance(e, dict) or not isinstance(e.get("problem"), dict) or not isinstance(e.get("kernel"), str):
        return "it is not a record with a problem and a kernel"
    p = e["problem"]
    lows = {"batch": 1, "channels": 1, "length": 1, "kernel_size": 1, "stride": 1, "padding": 0, "dilation": 1}
    if not all(_is_int(p.get(f), low) for f, low in lows.items()):
        return "a size of its problem is not a positive int"
    if not _is_int(p.get("padding_right", p["padding"])):
        return "its problem's right padding is not a non-negative int"
    if p.get("dtype") not in _DTYPES.values() or p.get("layout") not in _LAYOUTS or type(p.get("bias")) is not bool:
        return "its problem's dtype, layout or bias is not one this module knows"
    if not isinstance(p.get("activation", "none"), str) or p.get("activation", "none") not in _ACTIVATION_NAMES:
        return "its problem's activation is not one this module knows"
    if e.get("direction", "fwd") not in _DIRECTIONS:  # entries written before they had one are forward ones
        return "its direction is not fwd or bwd"
    machine = e.get("machine")
    if not isinstance(machine, dict) or not isinstance(machine.get("capability"), str) or not _CAPABILITY.fullmatch(
            machine["capability"]):
        return "it does not say which GPU architecture it was measured on"
    return None


def _signature(fields: dict) -> tuple:
    """What a tuned kernel may be lent by (the lent tables' key): a problem without its sizes, padding and bias."""
    return tuple(fields[name] for name in _SIGNATURE_FIELDS)


def _has_fast_generic(k: int, stride: int, dilation: int) -> bool:
    """Whether a fast generic kernel exists for these (then it runs untuned problems: chosen by measurement)."""
    return stride == 1 and dilation == 1 and k <= FAST_MAX_K


def _lent_tables(t: Tables) -> None:
    """For each signature with no fast generic kernel (K past 16, a stride or dilation), the tuned kernel of the
    largest problem of that signature whose launch takes sizes at run time: untuned problems of the signature
    run it rather than the scalar kernel (the gate checks each on other sizes, paddings and bias)."""
    for tuned, lent in ((t.tuned, t.lent), (t.tuned_bwd, t.lent_bwd)):
        for key in sorted(tuned, key=lambda e: (-e[0] * e[1] * e[2], e)):
            f = dict(zip(_KEY_FIELDS, key, strict=True))
            name = tuned[key]
            if not t.kernels[name][1]["sizes_at_run_time"] or _has_fast_generic(
                    f["kernel_size"], f["stride"], f["dilation"]):
                continue
            lent.setdefault(_signature(f), name)


def _entry_key(p: dict) -> tuple:
    """A (checked) entry's problem as the tuned tables key it: padding_right the left padding where the entry
    does not say, activation "none"."""
    return tuple(p.get(f, p["padding"] if f == "padding_right" else "none" if f == "activation" else None)
                 for f in _KEY_FIELDS)


def _launcher_table(text: str) -> tuple[dict[int, str], dict[str, str]]:
    """The launcher's kernel table (index -> name) and each kernel's declared parameter types."""
    return ({int(i): n for n, i in _TABLE_ROW.findall(text)}, dict(_DECLARATION.findall(text)))


# The tensor-core forward, and the split backward whose grad_x it computes: an Inf or NaN input spreads to
# nearby outputs (README)
TC_FAMILIES = ("dw1d_tc", "dw1d_bwdtc")


@dataclass
class Tables:
    """What this module dispatches to, after every check: only trusted kernels and entries are here."""

    kernels: dict = field(default_factory=dict)  # name -> (index in the launcher, kernel record)
    tuned: dict = field(default_factory=dict)  # problem key -> kernel name
    tuned_bwd: dict = field(default_factory=dict)  # problem key -> backward kernel name (tune.py --direction bwd)
    fast: dict = field(default_factory=dict)  # dtype_layout_kK -> kernel name
    fast_bwd: dict = field(default_factory=dict)  # the same, for the backward
    fast_narrow: dict = field(default_factory=dict)  # dtype_layout_kK -> kernels for the calls their scope admits
    fast_bwd_narrow: dict = field(default_factory=dict)
    lent: dict = field(default_factory=dict)  # signature (_SIGNATURE_FIELDS) -> a tuned forward kernel to lend
    lent_bwd: dict = field(default_factory=dict)  # the same, for the backward
    dropped: list = field(default_factory=list)  # names of kernels that are not built: a stub stands in
    warnings: list = field(default_factory=list)


def _trusted(m: dict, here: Path, capability: str | None, tensor_cores: bool = True) -> Tables:
    """The dispatch tables of a manifest that passed check_manifest.

    A kernel is trusted when its record is well-formed, the launcher's table has it at its index, and its
    file's sha256 is the recorded one; otherwise it is neither built nor called (its problems run the
    generic scalar kernel). A tuned entry is used when well-formed, its kernel is trusted and it was
    measured on this GPU architecture (`capability`, None when unknown): a kernel compiles and runs
    correctly anywhere, but tuning measured on another architecture says nothing about this one, so such
    an entry falls back to the generic kernel of its dtype, layout and K. A backward entry goes to the
    tuned_bwd table, a forward one to tuned; each must name a kernel of its direction. The generic designs
    are chosen to be good everywhere and are kept. The digests catch edits and corruption, not a forger who rewrites
    both a file and the manifest. With tensor_cores False (DWGEN_TENSOR_CORES=0), entries and fast generic
    kernels of the tensor-core families are left out: their problems run the CUDA-core generic kernels (README:
    non-finite inputs)."""
    t = Tables()
    launcher = (here / m["launcher"]).read_text() if (here / m["launcher"]).exists() else ""
    table, _ = _launcher_table(launcher)
    for index, k in enumerate(m["kernels"]):
        why = _kernel_problem(k)
        if why is None and table.get(index) != k["name"]:
            why = f"the launcher does not have it at index {index}"
        if why is None and _sha256(here / k["file"]) != k["sha256"]:
            why = f"{k['file']} is missing or differs from its recorded sha256 (edited or corrupted)"
        if why is None:
            t.kernels[k["name"]] = (index, k)
        else:
            name = k.get("name") if isinstance(k, dict) else None
            t.warnings.append(f"dwgen: kernel {name!r} of generated/ is not used: {why}; its problems run the "
                              "generic kernel (re-run the freeze to restore it)")
    t.dropped = sorted(n for i, n in table.items() if n not in t.kernels)
    foreign = set()
    for e in m["entries"]:
        why = _entry_problem(e)
        if why is None and e["kernel"] not in t.kernels:
            continue  # its kernel was refused above, with a warning
        direction = e.get("direction", "fwd") if why is None else None
        if why is None and t.kernels[e["kernel"]][1]["direction"] != direction:
            why = f"its kernel is not a {'forward' if direction == 'fwd' else 'backward'} kernel"
        if why is None and not tensor_cores and t.kernels[e["kernel"]][1]["config"].get("family") in TC_FAMILIES:
            continue  # the user asked for IEEE non-finite behaviour over the tensor cores' speed
        if why is None and capability is not None and e["machine"]["capability"] != capability:
            foreign.add(e["machine"]["capability"])
            continue
        if why is None:
            (t.tuned if direction == "fwd" else t.tuned_bwd)[_entry_key(e["problem"])] = e["kernel"]
        else:
            t.warnings.append(f"dwgen: a tuned entry of generated/ is not used: {why}; its problem runs the "
                              "generic kernel")
    if foreign:
        t.warnings.append(f"dwgen: generated/ was tuned on GPU architecture {', '.join(sorted(foreign))}, this GPU "
                          f"is {capability}: those entries fall back to the generic kernels; re-tune here with "
                          "`python tune.py`")
    def usable(name: str, direction: str, narrow: bool, key: str) -> bool:
        """Trusted, of the table's direction, of its key's signature (dtype, layout and K at stride and dilation
        1), and of a family whose scope the table holds (a narrow table only narrow ones); without tensor cores,
        not of a tensor-core family (its calls run the generic kernel, or the key's other fast kernel)."""
        if name not in t.kernels:  # dropped as untrusted: the key's calls run the generic kernel
            return False
        record = t.kernels[name][1]
        config, sig = record["config"], record.get("signature")
        family = config.get("family")
        dtype, layout, k = _FAST_KEY.fullmatch(key).groups()
        if not isinstance(sig, dict) or [sig.get(f) for f in ("dtype", "layout", "kernel_size", "stride", "dilation")] \
                != [dtype, layout, int(k), 1, 1]:
            t.warnings.append(f"dwgen: kernel {name!r} of generated/ is not used as a fast generic kernel: it was "
                              f"built for another signature than its table's key {key!r}; re-freeze with "
                              "`python -m search.generic`")
            return False
        if (family in _NARROW_SCOPES) != narrow:
            t.warnings.append(f"dwgen: kernel {name!r} of generated/ is not used as a fast generic kernel: its family "
                              f"serves {'some calls only' if not narrow else 'every call'}, not what its table holds")
            return False
        refusal = _scope_refusal(family, config)
        if refusal is not None:
            t.warnings.append(f"dwgen: kernel {name!r} of generated/ is not used as a fast generic kernel: {refusal}")
            return False
        return record["direction"] == direction and (tensor_cores or family not in TC_FAMILIES)

    for part, (direction, narrow) in _FAST_TABLES.items():
        table = m["generic"].get(part, {})
        if narrow:
            kept = {key: [n for n in names if usable(n, direction, True, key)] for key, names in table.items()}
            setattr(t, part, {key: names for key, names in kept.items() if names})
        else:
            setattr(t, part, {key: name for key, name in table.items() if usable(name, direction, False, key)})
    _lent_tables(t)
    return t


def _load(here: Path) -> tuple[dict, str | None]:
    """The manifest, and why it cannot be used when it cannot (the first call raises that)."""
    path = here / "manifest.json"
    if not path.exists():
        return {}, "dwgen: generated/manifest.json is missing; run `python tune.py` to create it"
    try:
        m = json.loads(path.read_text())
        check_manifest(m)
    except (ValueError, OSError) as e:  # ManifestError and json's JSONDecodeError are ValueErrors
        return {}, f"dwgen: generated/manifest.json {e if isinstance(e, ManifestError) else f'is unreadable ({e})'}; " \
                   "run `python tune.py` to write it again"
    return m, None


MANIFEST, _BROKEN = _load(_HERE)
_tables: dict[int, Tables] = {}  # by CUDA device index: each device has its architecture
_ext = None
_lock = threading.Lock()


def _capability(device: int | None) -> str | None:
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def tables(device: int | None = None) -> Tables:
    """The trusted dispatch tables for a CUDA device (the current one by default); warns once about what
    it refused; raises when the manifest cannot be used at all."""
    if _BROKEN:
        raise RuntimeError(_BROKEN)
    index = torch.cuda.current_device() if device is None and torch.cuda.is_available() else (device or 0)
    t = _tables.get(index)
    if t is None:
        with _lock:
            t = _tables.get(index)
            if t is None:
                t = _trusted(MANIFEST, _HERE, _capability(index) if torch.cuda.is_available() else None,
                             tensor_cores=os.environ.get("DWGEN_TENSOR_CORES", "1") != "0")
                seen = {w for other in _tables.values() for w in other.warnings}
                for w in t.warnings:
                    if w not in seen:
                        warnings.warn(w, stacklevel=3)
                _tables[index] = t
    return t


def _verified(rel: str, sha256: str) -> str:
    """The path of a file the module cannot do without, after checking its digest."""
    if _sha256(_HERE / rel) != sha256:
        raise RuntimeError(f"dwgen: generated/{rel} is missing or differs from the sha256 in manifest.json "
                           "(edited or corrupted); re-run the freeze (`python tune.py`) to write it again")
    return str(_HERE / rel)


def _stub(launcher: str, dropped: list[str]) -> str:
    """C++ defining the launch functions of refused kernels, so the launcher links; nothing calls them."""
    _, declared = _launcher_table(launcher)
    workspaces = dict(_WORKSPACE.findall(launcher))
    lines = ['// dwgen: stand-ins for kernels refused by the manifest check; never called', 'extern "C" {']
    for name in dropped:
        if _NAME.fullmatch(name) is None or name not in declared:
            raise RuntimeError(f"dwgen: the launcher declares no kernel {name!r}; re-run the freeze")
        lines.append(f"int dwgen_launch_{name}({declared[name]}) {{ return 98; }}  // cudaErrorInvalidDeviceFunction")
        if name in workspaces:
            lines.append(f"long long dwgen_workspace_{name}({workspaces[name]}) {{ return 0; }}")
    return "\n".join([*lines, "}", ""])


def _sources(t: Tables) -> list[str]:
    """The verified sources to compile: the launcher, trusted kernels, the scalar kernels, and a stub for
    any refused kernel. The launcher comes first: ninja starts jobs in this order, and its one C++ file
    (torch's headers, 23-36 s on the GPU host) is the build's longest job; listed last, it started 16 s into
    a 40 s build, when most kernels were done."""
    m = MANIFEST
    launcher = _verified(m["launcher"], m["launcher_sha256"])
    files = [launcher]
    files += [str(_HERE / k["file"]) for _, k in sorted(t.kernels.values(), key=lambda ik: ik[0])]
    files += [_verified(r["file"], r["sha256"]) for part in ("scalar", "scalar_bwd")
              for r in m["generic"][part].values()]
    if t.dropped:
        text = _stub(Path(launcher).read_text(), t.dropped)
        stub = Path(tempfile.gettempdir()) / f"dwgen-stub-{hashlib.sha256(text.encode()).hexdigest()[:16]}.cpp"
        if not stub.exists() or stub.read_text() != text:
            fd, tmp = tempfile.mkstemp(dir=stub.parent, suffix=".cpp")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, stub)
        files.append(str(stub))
    return files


# One nvcc run costs about 0.9 s of CPU beyond its kernels' own 0.6 s each (every kernel file alone: 410 s of
# jobs for 273 files on a two-core machine; all of them #included in one unit: 160 s), so kernels are compiled a
# few to a unit. About four units a core keep every core busy to the end of the build.
UNITS_PER_CORE = 4


def _translation_units(sources: list[str], build_dir: Path, jobs: int) -> list[str]:
    """What ninja compiles: the launcher (first: the longest job) and any stub as they are, and the kernel
    sources #included into at most UNITS_PER_CORE * jobs unit files in build_dir, balanced by size (each kernel
    is in its own namespace; its launch function's name is its own). A unit is named by the sha256 of its text,
    which holds each kernel's own sha256: builds of other kernel sets sharing a build folder (at once, or one after
    another) never overwrite each other's units, and a changed kernel is a new unit even where ninja tracks no
    included files. An existing unit is left alone, so an unchanged build stays a no-op for ninja."""
    kernels = [s for s in sources if s.endswith(".cu")]
    units: list[list[str]] = [[] for _ in range(max(1, min(len(kernels), UNITS_PER_CORE * jobs)))]
    load = [(0, i) for i in range(len(units))]
    for path in sorted(kernels, key=lambda s: (-os.path.getsize(s), s)):  # the largest first, each to the lightest
        size, i = heapq.heappop(load)
        units[i].append(path)
        heapq.heappush(load, (size + os.path.getsize(path), i))
    build_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for unit in (u for u in units if u):
        text = "// dwgen kernels compiled as one unit (written by build())\n" + "".join(
            f'#include "{path}"  // sha256 {hashlib.sha256(Path(path).read_bytes()).hexdigest()}\n'
            for path in sorted(unit))
        path = build_dir / f"dwgen_kernels_{hashlib.sha256(text.encode()).hexdigest()[:16]}.cu"
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=build_dir, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        paths.append(str(path))
    launcher, *rest = [s for s in sources if not s.endswith(".cu")]
    return [launcher, *paths, *rest]


def _build_jobs() -> int:
    """How many compile jobs torch's ninja run takes: MAX_JOBS when it is a number, else the cores this process
    may use."""
    jobs = os.environ.get("MAX_JOBS", "")
    if jobs.isdigit() and int(jobs) > 0:
        return int(jobs)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _build_directory(name: str) -> Path:
    """Where torch builds the extension: DWGEN_BUILD_DIR, else torch's own folder for `name` (a private torch
    function: where a torch lacks it, a folder of our own under the temporary directory)."""
    if os.environ.get("DWGEN_BUILD_DIR"):
        return Path(os.environ["DWGEN_BUILD_DIR"])
    try:
        from torch.utils.cpp_extension import _get_build_directory
    except ImportError:
        return Path(tempfile.gettempdir()) / "dwgen_extensions" / name
    return Path(_get_build_directory(name, False))


# The launcher's host code (checks, kernel choice, the autograd node, the bindings) is most of a small call's
# cost, and torch's load() compiles C++ without optimisation unless asked: on the CPU a model of the op's call
# with gradients took 7.8 µs at -O0 and 1.65 µs at -O3 (measured).
HOST_CFLAGS = ("-O3",)


def extension_name(sources: list[str]) -> str:
    """The extension's name carries the sha256 of its sources and host flags: a changed source is a new
    extension, never a stale one."""
    h = hashlib.sha256(" ".join(HOST_CFLAGS).encode())
    for path in sources:
        h.update(Path(path).read_bytes())
    return f"dwgen_generated_{h.hexdigest()[:16]}"


def build(verbose: bool = False):
    """Compile (once, cached by torch by content) and return the extension holding the kernels."""
    global _ext
    if _ext is not None:  # every call comes here: no lock once built
        return _ext
    t = tables()
    # Every device's tables before the lock: tables() takes it too (the first 2-GPU run deadlocked here).
    rows = [_table_rows(tables(device)) for device in range(torch.cuda.device_count())]
    with _lock:
        if _ext is not None:
            return _ext
        sources = _sources(t)
        # torch reads CUDA_HOME when cpp_extension is first imported; a bare `which nvcc` can mislead it.
        if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
            os.environ["CUDA_HOME"] = "/usr/local/cuda"
        from torch.utils.cpp_extension import load

        arch_before = os.environ.get("TORCH_CUDA_ARCH_LIST")
        if arch_before is None:  # build for this GPU only (or Hopper when there is none, as in CI)
            cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
            os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cap[0]}.{cap[1]}"
        try:
            name = extension_name(sources)
            build_dir = _build_directory(name)
            ext = load(
                name=name,
                sources=_translation_units(sources, build_dir, _build_jobs()),
                extra_cflags=list(HOST_CFLAGS),
                extra_cuda_cflags=list(MANIFEST["nvcc_flags"]),  # checked plain by check_manifest
                build_directory=str(build_dir),
                verbose=verbose,
            )
        finally:
            if arch_before is None:
                del os.environ["TORCH_CUDA_ARCH_LIST"]
        for device, (tuned, fast, lent) in enumerate(rows):
            ext.install(device, tuned, fast, lent)
        _register_fakes()
        _ext = ext
        return _ext


_DTYPE_INDEX = {"fp32": 0, "fp16": 1, "bf16": 2}
_LAYOUT_INDEX = {"bcl": 0, "blc": 1}


def _choice_row(t: Tables, name: str) -> list[int]:
    index, k = t.kernels[name]
    return [index, k["align_bytes"], k["channel_multiple"], int(k["peels_misalignment"])]


def _table_rows(t: Tables) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """The trusted tables as the C++ dispatcher takes them (direction, dtype and layout numbered)."""
    tuned = []
    for direction, table in ((0, t.tuned), (1, t.tuned_bwd)):
        for key, name in table.items():
            f = dict(zip(_KEY_FIELDS, key, strict=True))
            tuned.append([direction, f["batch"], f["channels"], f["length"], f["kernel_size"], f["stride"],
                          f["padding"], f["padding_right"], f["dilation"], _DTYPE_INDEX[f["dtype"]], int(f["bias"]),
                          _LAYOUT_INDEX[f["layout"]], _ACTIVATION_NAMES.index(f["activation"]),
                          *_choice_row(t, name)])
    fast = []  # rank 0 the kernel for every call, 1.. the narrow ones in order; then its scope's number
    for part, (direction, narrow) in _FAST_TABLES.items():
        for key, names in getattr(t, part).items():
            dtype, layout, k = _FAST_KEY.fullmatch(key).groups()
            for rank, name in enumerate(names if narrow else [names], start=int(narrow)):
                fast.append([_DIRECTIONS.index(direction), _DTYPE_INDEX[dtype], _LAYOUT_INDEX[layout], int(k), rank,
                             _SCOPES.index(_scope(t, name)), *_choice_row(t, name)])
    lent = []
    for direction, table in ((0, t.lent), (1, t.lent_bwd)):
        for key, name in table.items():
            f = dict(zip(_SIGNATURE_FIELDS, key, strict=True))
            lent.append([direction, f["kernel_size"], f["stride"], f["dilation"], _DTYPE_INDEX[f["dtype"]],
                         _LAYOUT_INDEX[f["layout"]], _ACTIVATION_NAMES.index(f["activation"]), *_choice_row(t, name)])
    return tuned, fast, lent


def _output_layout(x) -> str:
    """The memory order of the result, as the C++ side picks it: (B, L, C) only for a (B, L, C) x."""
    return "blc" if not x.is_contiguous() and x.transpose(1, 2).is_contiguous() else "bcl"


def _register_fakes() -> None:
    """Shapes and strides of both ops for tracing (torch.compile, opcheck), symbolic sizes included."""

    def empty(x, length):
        b, c = x.shape[0], x.shape[1]
        if _output_layout(x) == "blc":
            return x.new_empty((b, length, c)).transpose(1, 2)
        return x.new_empty((b, c, length))

    @torch.library.register_fake("dwgen::depthwise_conv1d")
    def _(x, weight, bias, stride, pad_left, pad_right, dilation, activation):
        # The kernels' own checks, in the same words: a call on meta tensors reaches only this.
        name = next((a for a, i in _ACTIVATIONS.items() if i == activation), activation)
        _check_arguments(x, weight, bias, stride, dilation, name)
        if pad_left < 0 or pad_right < 0:
            raise ValueError(f"dwgen: padding must be an int >= 0, got {pad_left} and {pad_right}")
        padding = pad_left if pad_left == pad_right else f"{pad_left}+{pad_right}"
        return empty(x, _output_length(x, weight.shape[2], pad_left, pad_right, stride, dilation, padding))

    @torch.library.register_fake("dwgen::depthwise_conv1d_backward")
    def _(grad_out, x, weight, bias, stride, pad_left, pad_right, dilation, activation):
        return empty(x, x.shape[2]), weight.new_empty(weight.shape), weight.new_empty((weight.shape[0],))


_ACTIVATIONS = {None: 0, "silu": 1}


def _paddings(padding, k: int, stride: int, dilation: int) -> tuple[int, int]:
    """Left and right padding of an int, "same" or "causal"."""
    if padding == "causal":
        return dilation * (k - 1), 0
    if padding == "valid":
        return 0, 0
    if padding == "same":
        if stride != 1:
            raise ValueError("dwgen: padding='same' needs stride 1 (as in PyTorch); give the padding as an int")
        total = dilation * (k - 1)
        return total // 2, total - total // 2
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"dwgen: padding must be an int >= 0, 'same', 'valid' or 'causal', got {padding!r}")
    return padding, padding


def _validate(x, weight, bias, stride, padding, dilation, activation=None,
              meta: bool = False) -> tuple[int, int, int]:
    """(left padding, right padding, output length), or one line saying what is wrong (the device is
    checked last, so every other mistake reads the same whether or not the tensors are on the GPU). With
    meta, tensors on the meta device pass too: a call on them returns the result's shape, as F.conv1d does."""
    _check_arguments(x, weight, bias, stride, dilation, activation)
    k = weight.shape[2]
    left, right = _paddings(padding, k, stride, dilation)
    if max(left, right) > _ARG_LIMIT:
        raise ValueError(f"dwgen: padding must be at most 2**31 - 1 a side, got {left} and {right}")
    out_length = _output_length(x, k, left, right, stride, dilation, padding)
    if not (x.is_cuda or (meta and x.is_meta)):
        raise ValueError("dwgen: x must be on a CUDA device; move it with x.cuda()")
    return left, right, out_length


def _check_arguments(x, weight, bias, stride, dilation, activation) -> None:
    """Everything but the padding and the device, one line for the first mistake."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError("dwgen: x must be a (batch, channels, length) tensor")
    if x.dtype not in _DTYPES:
        raise TypeError(f"dwgen: x must be float32, float16 or bfloat16, got {x.dtype}")
    channels = x.shape[1]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3 or weight.shape[0] != channels or weight.shape[1] != 1:
        raise ValueError(f"dwgen: weight must have shape ({channels}, 1, K) for depthwise conv, "
                         f"got {tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.shape[2] < 1:
        raise ValueError("dwgen: weight has K = 0 taps; a convolution needs at least one")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (channels,)):
        raise ValueError(f"dwgen: bias must have shape ({channels},) or be None")
    for t in (weight, bias):
        if t is not None and (t.device != x.device or t.dtype != x.dtype):
            raise ValueError(f"dwgen: weight and bias must be {x.dtype} on {x.device}, like x")
    for name, v, low in (("stride", stride, 1), ("dilation", dilation, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"dwgen: {name} must be an int >= {low}, got {v!r}")
        if v > _ARG_LIMIT:
            raise ValueError(f"dwgen: {name} must be at most 2**31 - 1, got {v}")
    if not isinstance(activation, (str, type(None))) or activation not in _ACTIVATIONS:
        raise ValueError(f"dwgen: activation must be None or 'silu', got {activation!r}")


def _output_length(x, k: int, left: int, right: int, stride: int, dilation: int, padding) -> int:
    span = x.shape[2] + left + right - dilation * (k - 1) - 1
    if span < 0:
        raise ValueError(f"dwgen: no output for length {x.shape[2]}, kernel {k}, padding {padding}, "
                         f"dilation {dilation}; raise padding or the length")
    return span // stride + 1


def _scope_refusal(family: str | None, config: dict) -> str | None:
    """Why a narrow family's design cannot take every call its scope admits (space.scope_violations, restated
    on a manifest record), else None: a walk backward whose blocks cover fewer positions than the left_halo grid
    rule counts on; a lane forward walking tiles, whose grid counts a row's chunks."""
    walk = _NARROW_SCOPES.get(family) == "left_halo"
    if walk and config["threads"] // config["ct"] * config["seg"] < _LEFT_HALO_SPAN:  # positions a block covers
        return f"its blocks cover fewer than the {_LEFT_HALO_SPAN} positions its scope's grid rule counts on"
    if family == "dw1d_lane" and config.get("walk") != "row":
        return "it walks tiles, whose grid cannot take every row its scope admits"
    return None


def _scope(t: Tables, name: str) -> str:
    return _NARROW_SCOPES.get(t.kernels[name][1]["config"].get("family"), "any")


def _admits(scope: str, k: int, left: int, right: int, activation, batch: int, length: int, elem_size: int) -> bool:
    """Whether a fast generic kernel of this scope takes a call at stride and dilation 1 (space.scope_admits for
    the call's terms; the launcher's admits)."""
    h, plain = k - 1, (activation or "none") == "none"
    if scope == "within_halo":
        return plain and max(left, right) <= h
    if scope == "causal_or_centred":
        return (length % (16 // elem_size) == 0 and batch <= 65535 and length <= 2**30
                and ((left, right) == (h, 0) or ((left, right) == (h // 2, h - h // 2) and plain)))
    if scope == "left_halo":
        out = length + left + right - h
        return left == h and out <= 2**30 and batch * -(-out // _LEFT_HALO_SPAN) <= 65535
    return scope == "any"


def _layout(x) -> str | None:
    """ "bcl" for a contiguous x, "blc" for a (B, L, C)-contiguous tensor viewed as (B, C, L) (every stride
    exact, size-1 dimensions too), else None: the C++ layout_of's rule, so that kernel_for names what runs."""
    if x.is_contiguous():
        return "bcl"
    _, c, length = x.shape
    return "blc" if x.stride() == (c * length, 1, c) else None


def kernel_for(x, weight, bias=None, stride=1, padding=0, dilation=1, direction="fwd", activation=None,
               grad_out=None) -> str:
    """Name of the kernel depthwise_conv1d would run for these arguments (its backward, for direction bwd);
    the same choice as the C++ dispatcher makes. A tuned kernel is chosen only for the problem it was tuned
    for, paddings (left and right) and activation included, with or without bias (a run-time argument of every
    kernel, each checked both ways): the kernel tuned with the call's bias first. For the backward, grad_out
    (when given) must have x's layout and the kernel's alignment too, else the scalar kernel runs."""
    left, right, out_length = _validate(x, weight, bias, stride, padding, dilation, activation)
    if _BROKEN:
        raise RuntimeError(_BROKEN)
    t = tables(x.device.index)
    dtype, k = _DTYPES[x.dtype], weight.shape[2]
    layout = _layout(x)
    grad_out = grad_out if direction == "bwd" else None  # only the backward reads it
    generic = MANIFEST["generic"]["scalar" if direction == "fwd" else "scalar_bwd"][dtype]["name"]
    if layout is None or x.shape[0] * x.shape[1] * max(x.shape[2], out_length) >= _INT32_LIMIT:
        return generic
    if grad_out is not None and _layout(grad_out) != layout:
        return generic
    tuned = t.tuned if direction == "fwd" else t.tuned_bwd
    keys = [(*x.shape, k, stride, left, right, dilation, dtype, b, layout, activation or "none")
            for b in (bias is not None, bias is None)]

    def takes_x(name: str) -> bool:
        kernel = t.kernels[name][1]
        align = x.element_size() if kernel["peels_misalignment"] else kernel["align_bytes"]
        grad_aligned = grad_out is None or grad_out.data_ptr() % kernel["align_bytes"] == 0
        return x.shape[1] % kernel["channel_multiple"] == 0 and x.data_ptr() % align == 0 and grad_aligned

    name = tuned.get(keys[0], tuned.get(keys[1]))
    if name is not None and takes_x(name):
        return name
    if name is not None and direction == "bwd":  # a tuned backward that cannot take x: the scalar one, as C++ does
        return generic
    # no tuned kernel, or a forward one that cannot take this x (a lane kernel and an x off a 16-byte boundary):
    # the fast generic kernel (the one chosen for calls padded within the halo without an activation first, where
    # there is one), which peels a misaligned head over (B, C, L); where there is none, a tuned kernel of the same
    # signature lent for paddings up to the halo a side
    if _has_fast_generic(k, stride, dilation):
        key = f"{dtype}_{layout}_k{k}"
        for narrow in (t.fast_narrow if direction == "fwd" else t.fast_bwd_narrow).get(key, []):
            if _admits(_scope(t, narrow), k, left, right, activation, x.shape[0], x.shape[2], x.element_size()) \
                    and takes_x(narrow):
                return narrow
        other = (t.fast if direction == "fwd" else t.fast_bwd).get(key)
    elif max(left, right) <= (k - 1) * dilation:
        lent = t.lent if direction == "fwd" else t.lent_bwd
        other = lent.get(_signature(dict(kernel_size=k, stride=stride, dilation=dilation, dtype=dtype, layout=layout,
                                         activation=activation or "none")))
    else:
        other = None
    return other if other is not None and takes_x(other) else generic


_OP = None  # torch.ops.dwgen.depthwise_conv1d, once the extension is loaded: autograd, tracing, subclasses
_DIRECT = None  # the same C++ forward, called without the op's dispatch (a METH_FASTCALL function)
_CALL_OP = None  # the op through the C++ dispatcher (autograd, dispatch modes) without torch.ops's boxing
_FUNCTION_MODE = torch._C._is_torch_function_mode_enabled  # a TorchFunctionMode is listening
_DISPATCH_MODES = torch._C._len_torch_dispatch_stack  # TorchDispatchModes (FakeTensorMode, FlopCounterMode, ...)
_FAST = True  # off while dwgen.record listens: every call then takes the checked path


def _load_op() -> None:
    global _OP, _DIRECT, _CALL_OP
    ext = build()
    _OP = torch.ops.dwgen.depthwise_conv1d  # the packet: faster to call than its .default overload
    _DIRECT = ext.forward
    _CALL_OP = ext.call_op


def _call_checked(x, weight, bias, stride, padding, dilation, activation):
    """The slow path: every argument checked here first (one clear line for any mistake), then the op (whose
    fake implementation answers for meta tensors, through the dispatcher)."""
    left, right, _ = _validate(x, weight, bias, stride, padding, dilation, activation, meta=True)
    if _BROKEN:
        raise RuntimeError(_BROKEN)
    if _OP is None:
        _load_op()
    return _OP(x, weight, bias, stride, left, right, dilation, _ACTIVATIONS[activation])


def depthwise_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride: int = 1, padding: int | str = 0, dilation: int = 1,
                     activation: str | None = None) -> torch.Tensor:
    """F.conv1d(x, weight, bias, stride, padding, dilation, groups=channels), on dwgen's kernels, with
    autograd. padding is an int, "same", "valid" or "causal" (dilation * (K - 1) on the left only: output
    length L, nothing computed past it); activation "silu" applies SiLU to the result, fused into the kernels.

    x may be (B, C, L) contiguous or a (B, L, C) tensor viewed as (B, C, L); the result (and grad_x) has
    x's memory order. Any other strides are read as they are by the generic kernels, which write (B, C, L).
    """
    direct = _DIRECT if _FAST else None
    if direct is None:
        return _call_checked(x, weight, bias, stride, padding, dilation, activation)
    try:  # the common calls go straight to C++, which checks everything itself
        if type(padding) is int:
            left = right = padding
        elif padding == "causal":
            left, right = dilation * (weight.shape[2] - 1), 0
        else:
            return _call_checked(x, weight, bias, stride, padding, dilation, activation)
        act = 0 if activation is None else 1 if activation == "silu" else -1
        if act < 0:
            return _call_checked(x, weight, bias, stride, padding, dilation, activation)
        # Tracing, tensor subclasses and torch-function modes need torch.ops; autograd and dispatch modes only
        # the dispatcher, reached from C++; with neither a graph to record nor a mode listening, the kernel.
        if type(x) is not torch.Tensor or torch.compiler.is_compiling() or _FUNCTION_MODE():
            return _OP(x, weight, bias, stride, left, right, dilation, act)
        if _DISPATCH_MODES() or (torch.is_grad_enabled() and (
                x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))):
            return _CALL_OP(x, weight, bias, stride, left, right, dilation, act)
        return direct(x, weight, bias, stride, left, right, dilation, act)
    except (RuntimeError, TypeError, ValueError, AttributeError, IndexError) as e:
        if isinstance(x, torch.Tensor) and x.is_meta:  # the C++ path refuses them: shapes come from the op
            return _call_checked(x, weight, bias, stride, padding, dilation, activation)
        if str(e).startswith("dwgen:"):
            raise
        _validate(x, weight, bias, stride, padding, dilation, activation)  # say what is wrong in one line
        raise

if __name__ != "dwgen.frozen_dispatch":  # as generated/__init__.py; the layer is generated/layers.py beside it
    from .layers import DepthwiseConv1d, swap_conv1d  # noqa: E402,F401  (it calls depthwise_conv1d above)
