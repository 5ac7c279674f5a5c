"""Reading lattnbench result files, shared by compare.py, merge.py and plot.py.

Two formats are read:
  * lattnbench's own (docs/results.md): `schema_version` 1.x, `backend`/`decay` on every record;
  * the JAX reference format (../shared/reference-results.json): no `schema_version`, memory as
    `xla_temp_mb`/`xla_arg_mb`/`xla_out_mb`, no `backend`/`decay`/`status` keys, and layer records
    whose `dim` is the head dimension.
`load` hands back records normalised to lattnbench's key names, so no script branches on the
format. Any bad input raises ResultFileError with a one-line message naming the file.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field

# Mirrors schema_version in docs/results.md: a reader accepts the major version it knows.
SUPPORTED_SCHEMA_MAJOR = 1

EXIT_BAD_INPUT = 2

# A lattnbench result file lists its records' identity keys itself (`identity_keys`: every key that
# sets one case apart from another, the ops' own keys among them), and load() takes them from there;
# this list is for the files that do not (the reference file, files written before the list was):
# rule, gate_norm and normalize_keys are the kernel op's own keys (docs/config.md): cases that differ
# only in them are different cases (the delta rule against the additive one, strong gates against
# weak ones), so they are part of the identity.
IDENTITY_KEYS = ("suite", "impl", "mode", "backend", "dtype", "decay", "rule", "gate_norm", "normalize_keys",
                 "batch", "heads", "seq", "dim", "chunk", "window", "head_dim", "tokens", "snapshots")

# Short names for printing a case; values equal to the default are left out to keep rows short.
# The identity keys the files loaded so far declared beyond IDENTITY_KEYS, in the order first seen:
# every case key is a tuple over identity_keys(), so that records of two files compare.
_DECLARED_KEYS = []


def identity_keys():
    """IDENTITY_KEYS, then the keys loaded files declared that it does not hold."""
    return IDENTITY_KEYS + tuple(_DECLARED_KEYS)


_LABEL_PREFIX = {"batch": "B=", "heads": "H=", "seq": "T=", "dim": "D=", "chunk": "C=",
                 "window": "W=", "head_dim": "Dh=", "decay": "decay=", "rule": "rule=", "gate_norm": "gate_norm=",
                 "normalize_keys": "normalize_keys=", "dtype": "", "snapshots": "K="}
_LABEL_DEFAULTS = {"decay": "none", "rule": "additive", "normalize_keys": True, "dtype": "float32"}

_REFERENCE_KEY_NAMES = {"xla_temp_mb": "temp_mb", "xla_arg_mb": "arg_mb", "xla_out_mb": "out_mb"}


class ResultFileError(Exception):
    """Bad input; the message is one line that names the file and what is wrong."""


@dataclass
class ResultFile:
    path: str
    raw: dict                  # the document as read; merge.py writes its records back unchanged
    records: list              # normalised copies of raw["results"], same order
    is_reference: bool
    schema_major: int | None   # None for the reference format
    device: dict = field(default_factory=dict)

    @property
    def format_name(self):
        """'lattnbench 0.1.0, schema 1.0.0': the program's version (the file's `version`, else the
        device block's `lattnbench_version`) and the result file's schema_version, each named."""
        if self.is_reference:
            return "reference (JAX)"
        version = self.raw.get("version") or self.device.get("lattnbench_version") or "version unknown"
        return f"lattnbench {version}, schema {self.raw['schema_version']}"

    @property
    def fingerprint(self):
        """What must be equal for two files to count as the same device (see same_device)."""
        signature = self._cpu_signature
        return self._named_device + (f" ({signature})" if signature else "")

    @property
    def _cpu_signature(self):
        # A CPU run's speed is the CPU's; a CUDA run's is the GPU's, named in full already.
        return self.device.get("cpu_signature") if self.device.get("backend") == "cpu" else None

    @property
    def _named_device(self):
        if self.is_reference:
            return f"{reference_backend(self.device)}/{self.device.get('device_kind', '?')}"
        backend = self.device.get("backend", "unknown")
        name = self.device.get("gpu") if backend == "cuda" else self.device.get("cpu_model")
        return f"{backend}/{name or '?'}"

    def same_device(self, other):
        """Equal fingerprints; where one file has no cpu_signature (written before lattnbench
        recorded it), equal backends and device names."""
        if self._cpu_signature and other._cpu_signature:
            return self.fingerprint == other.fingerprint
        return self._named_device == other._named_device

    @property
    def device_label(self):
        """A human name for the device, for titles and legends."""
        d = self.device
        if self.is_reference:
            jax = f"JAX {d['jax']}" if "jax" in d else "reference"
            return f"{jax}, XLA {d.get('device_kind', d.get('backend', '?'))}"
        if d.get("backend") == "cuda":
            return d.get("gpu", "unknown GPU")
        threads = f" ({d['threads']} threads)" if "threads" in d else ""
        return f"{d.get('cpu_model', 'unknown CPU')}{threads}"

    @property
    def backends(self):
        return sorted({str(r["backend"]) for r in self.records})


def reference_backend(device):
    # The reference file names the XLA platform ("cpu"); prefixing "jax-" keeps a JAX CPU run
    # from passing for a lattnbench cpu run.
    backend = device.get("backend", "unknown")
    return f"jax-{backend}" if "jax" in device else backend


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ResultFileError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ResultFileError(f"{path}: not JSON: not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultFileError(f"{path}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    return from_document(path, doc)


def from_document(path, doc):
    """A ResultFile from a document already parsed (a line of scripts/history.py's history); path
    names it in messages."""
    if not isinstance(doc, dict):
        raise ResultFileError(f"{path}: not a result file: the top level is not a JSON object")
    if not isinstance(doc.get("results"), list):
        raise ResultFileError(f"{path}: not a result file: no 'results' list")

    is_reference = "schema_version" not in doc
    major = None if is_reference else _schema_major(path, doc["schema_version"])
    device = doc.get("device") if isinstance(doc.get("device"), dict) else {}
    default_backend = reference_backend(device) if is_reference else device.get("backend", "unknown")
    declared = doc.get("identity_keys", [])
    if not isinstance(declared, list) or not all(isinstance(k, str) for k in declared):
        raise ResultFileError(f"{path}: identity_keys is not a list of key names")
    for k in declared:
        if k not in IDENTITY_KEYS and k not in _DECLARED_KEYS:
            _DECLARED_KEYS.append(k)
    records = []
    for position, record in enumerate(doc["results"]):
        if not isinstance(record, dict):
            raise ResultFileError(f"{path}: results[{position}] is not a JSON object")
        records.append(_normalise(record, default_backend, is_reference))
    return ResultFile(path, doc, records, is_reference, major, device)


def _schema_major(path, version):
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        raise ResultFileError(f"{path}: schema_version {version!r} is not MAJOR.MINOR.PATCH") from None
    if major != SUPPORTED_SCHEMA_MAJOR:
        raise ResultFileError(f"{path}: schema_version {version} is not supported "
                              f"(this reader knows {SUPPORTED_SCHEMA_MAJOR}.x)")
    return major


def _normalise(record, default_backend, is_reference):
    r = dict(record)
    for old, new in _REFERENCE_KEY_NAMES.items():
        if old in r and new not in r:
            r[new] = r[old]
    r.setdefault("backend", default_backend)
    r.setdefault("decay", "none")
    # Files from before the delta rule (and the reference file) ran the additive rule only.
    if r.get("suite") == "kernel":
        r.setdefault("rule", "additive")
    r.setdefault("dtype", "float32")
    # The reference records only cases that ran and passed its own checks.
    r.setdefault("status", "ok")
    if is_reference and r.get("suite") == "layer" and "head_dim" not in r and "dim" in r:
        r["head_dim"] = r["dim"]
    return r


def case_key(record, ignore=()):
    """The identity of a case (docs/results.md), as a tuple over identity_keys(); absent keys are None.

    A layer case is fixed by `heads` and `head_dim`. Its `dim` is the head dimension in the
    reference file but may be the model width (heads * head_dim) in lattnbench's, so it is left
    out of the key to let the two match.
    """
    def keep(k):
        return k not in ignore and not (k == "dim" and _is_layer_with_head_dim(record))
    return tuple(record.get(k) if keep(k) else None for k in identity_keys())


def key_as_dict(key):
    return {k: v for k, v in zip(identity_keys(), key) if v is not None}


def describe_case(record, ignore=()):
    """A short, readable identity: 'kernel chunked fwd cpu B=2 H=4 T=512 D=32 C=128'."""
    values = key_as_dict(case_key(record, ignore))
    words = [str(values[k]) for k in ("suite", "impl", "mode", "backend") if k in values]
    for k, prefix in _LABEL_PREFIX.items():
        if k in values and values[k] != _LABEL_DEFAULTS.get(k):
            words.append(f"{prefix}{values[k]}")
    words += [f"{k}={values[k]}" for k in _DECLARED_KEYS if k in values and k not in _LABEL_PREFIX]
    return " ".join(words)


def _is_layer_with_head_dim(record):
    return record.get("suite") == "layer" and record.get("head_dim") is not None


def index_by_case(result_file, ignore=()):
    """{case_key: record}; a case recorded twice is an error, since it cannot be matched."""
    index = {}
    for record in result_file.records:
        key = case_key(record, ignore)
        if key in index:
            raise ResultFileError(f"{result_file.path}: case '{describe_case(record, ignore)}' appears twice")
        index[key] = record
    return index


def number(value):
    """value as a finite float, or None; bools and strings do not count."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def why_not_passed(record):
    """Why a record takes no part in a ranking of impls (lattnbench's summary, compare.py's and the
    plots' fastest lines), or '' when it passed: it is ok, was measured with samples, and its
    rel_err is within its tolerance (src/results/summary.cpp's passed())."""
    status = record.get("status", "ok")
    if status != "ok":
        return (record.get("skip_reason") or record.get("unchecked_reason") or record.get("check_failure")
                or record.get("error") or f"status {status}")
    rel_err, tolerance = number(record.get("rel_err")), number(record.get("tolerance"))
    if rel_err is not None and tolerance is not None and rel_err > tolerance:
        return f"rel_err {rel_err:.2e} > tolerance {tolerance:.2e}"
    if number(record.get("median_ms")) is None:
        return "not measured"
    if isinstance(record.get("samples_ms"), list) and not record["samples_ms"]:
        return "no samples"
    return ""


def passed(record):
    return not why_not_passed(record)


def totals(records):
    counts = {"cases": len(records), "ok": 0, "failed": 0, "skipped": 0, "unchecked": 0}
    for r in records:
        if r.get("status") in counts:
            counts[r["status"]] += 1
    return counts


def write_text_atomic(path, text):
    """Write through a temporary file in the same folder and rename it, so no reader sees half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as e:
        raise ResultFileError(f"{path}: cannot write: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        # mkstemp creates the file 0600; a result file should be as readable as any other.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ResultFileError(f"{path}: cannot write: {e.strerror}") from None


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr and exit status 2, like any other bad input."""

    def error(self, message):
        fail(self.prog, message)


def fail(prog, message):
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def run_cli(main):
    """Run main(argv) -> exit status; ResultFileError becomes one line on stderr and status 2."""
    prog = os.path.basename(sys.argv[0])
    try:
        status = main(sys.argv[1:])
    except ResultFileError as e:
        fail(prog, str(e))
    sys.exit(status)
