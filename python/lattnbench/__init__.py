"""lattnbench's result files as pandas DataFrames (docs/python.md lists load()'s columns).

    import lattnbench
    df = lattnbench.load("results/mine.json")      # one row per record, with device.* and config.* columns
    verdicts = lattnbench.compare("base.json", "new.json")   # scripts/compare.py's verdicts, one row a case

The reading and the verdicts are scripts/lattn_results.py's and scripts/compare.py's own code (this
package's lattn_results.py and compare.py are those files), so the package and the scripts never
disagree; only the DataFrames are made here.
"""

# The modules this one uses are imported under private names, so that `dir(lattnbench)` and
# tab completion show the package's own names only.
import json as _json
import os as _os

import pandas as _pd

from . import compare as _compare
from . import lattn_results as _results
from .lattn_results import ResultFileError

# Importing the submodules made them attributes of the package; only the functions are its API.
del lattn_results  # noqa: F821 (bound by the relative import above)

# lattnbench's version (CMakeLists.txt's project VERSION and pyproject.toml's, kept equal by
# tests/python/test_package.py).
__version__ = "0.1.0"

__all__ = ["load", "compare", "ResultFileError", "__version__"]


def _flat(prefix, block):
    """A nested dict as {prefix.key.subkey: value}; lists stay values."""
    out = {}
    for key, value in (block or {}).items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            out.update(_flat(name, value))
        else:
            out[name] = value
    return out


def load(path):
    """The records of a result file (lattnbench's or the JAX reference format) as a DataFrame:
    one row per record with its keys normalised as compare.py reads them, plus the file's `device`
    block as device.* columns and its `config` block as config.* columns (config.plugins: each
    plugin's path, name and sha256), and `file`. Raises ResultFileError for a bad file."""
    result = _results.load(_os.fspath(path))
    shared = {"file": result.path, **_flat("device", result.device), **_flat("config", result.raw.get("config"))}
    rows = [{**record, **shared} for record in result.records]
    return _pd.DataFrame(rows)


def compare(base, new, threshold="10%", alpha=0.05, bootstrap=10000, metric="median_ms", strict=False,
            ignore_backend=False, ignore_device=False, allow_gone=False, allow_new=False):
    """compare.py's verdicts of NEW against BASE (paths) as a DataFrame, one row per case: the case's
    identity (case.* columns), label, verdict (SLOWER, FAILED, UNSURE, FASTER, SAME, NEW, GONE,
    SKIPPED), base and new values of `metric`, change_pct, the interval and its kind, temp_mb on
    both sides and the note. The run's summary line, exit status (what compare.py would exit with)
    and fastest impls are in the frame's attrs. Arguments as compare.py's flags (docs/compare.md)."""
    options = _compare.Options(metric, _compare.parse_threshold(str(threshold)), alpha, bootstrap)
    comparison = _compare.compare(_results.load(_os.fspath(base)), _results.load(_os.fspath(new)), options,
                                  ignore_backend, ignore_device, strict, allow_gone, allow_new)
    doc = _json.loads(_compare.render_json(comparison))
    frame = _pd.json_normalize(doc["cases"]) if doc["cases"] else _pd.DataFrame()
    frame.attrs.update(summary=doc["summary"], exit_status=doc["exit_status"], winners=doc["winners"],
                       crossovers=doc["crossovers"], counts=doc["counts"])
    return frame
