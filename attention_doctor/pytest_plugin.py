"""The doctor in a maintainer's test suite: a pytest plugin, on once the package is installed (the
`pytest11` entry point `attention_doctor`; `-p attention_doctor.pytest_plugin` where it is not).

    import pytest
    from my_pkg import build

    @pytest.mark.attention_doctor(baseline="attention_baseline.json")
    def test_attention():
        return build()          # the model examined; or name it: attention_doctor("my_pkg.model:build")

A marked test is one test per check (`test_attention[kv_cache]`, the id a CI dashboard tracks). The
model is built and examined once per test (and per value of its other parameters); its checks share
the result. A check's test:

    pass, warn        passed (a warn also warns, saying what the caller must pass)
    n/a               skipped, saying why
    fail              failed, with the cause and the doctor's table; xfailed where the baseline
                      expects that outcome and cause (attention_doctor.baseline)
    inconclusive      failed (the doctor could not look), unless allow_inconclusive names it
                      (True: any) or the baseline expects it; then skipped / xfailed
    expected, but did not happen
                      XPASS, listed at the end; failed under --attention-doctor-strict or the
                      baseline's "strict": true, as xfail(strict=True)

Marker keywords: target (a TARGET string, as the command takes, instead of a returned model),
baseline (a file, relative to the test file), allow_inconclusive, and examine()'s own (checks,
causal, device, dtype, seed, T). Options: --attention-doctor-json DIR keeps every result (one JSON
file per examined model, judged against its baseline); --attention-doctor-strict. Loading the
plugin imports no torch: a suite that marks nothing pays nothing."""
import inspect
import re
import warnings
from pathlib import Path

import pytest

from attention_doctor.checks import ORDER

MARK = "attention_doctor"
CHECK = "attention_doctor_check"   # the parameter each marked test is parametrised by
_RESULTS = pytest.StashKey[dict]()
_FIXED = pytest.StashKey[list]()


class AttentionDoctorWarning(UserWarning):
    """A check that held only with what the caller must pass (a `warn` row)."""


def pytest_addoption(parser):
    g = parser.getgroup("attention doctor")
    g.addoption("--attention-doctor-json", metavar="DIR", default=None,
                help="write each examined model's result (judged against its baseline) as JSON in DIR")
    g.addoption("--attention-doctor-strict", action="store_true", default=False,
                help="an expected failure (baseline) that did not happen fails, as xfail(strict=True)")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARK}(target=None, *, baseline=None, allow_inconclusive=(), **examine_kw): "
                            "examine the model the test returns (or the TARGET named), one test per check")
    config.stash[_RESULTS], config.stash[_FIXED] = {}, []


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker(MARK)
    if marker is None:
        return
    checks = list(marker.kwargs.get("checks") or ORDER)
    unknown = [c for c in checks if c not in ORDER]
    if unknown:
        pytest.fail(f"{metafunc.function.__name__}: unknown check(s) {', '.join(unknown)}; the checks: "
                    f"{', '.join(ORDER)}", pytrace=False)
    metafunc.parametrize(CHECK, [c for c in ORDER if c in checks], ids=str)


@pytest.fixture(autouse=True)
def attention_doctor_check(request):
    """The check a marked test's item judges (None for any other test)."""
    return getattr(request, "param", None)


def _model_key(item) -> str:
    """The examined model's key and name: the test's id without its check (its other parameters kept)."""
    ids = item.callspec.id.split("-")
    ids.reverse()
    ids.remove(item.callspec.params[CHECK])   # the check's own id (the last, where another id is the same)
    ids.reverse()
    return item.nodeid.split("[")[0] + (f"[{'-'.join(ids)}]" if ids else "")


def _examined(item, marker):
    """The item's model examined and judged against its baseline (a DoctorResult), or the one line
    why it could not be (a str: the target or the baseline unusable)."""
    from attention_doctor.baseline import Baseline
    from attention_doctor.examination import examine
    from attention_doctor.signals import TargetError
    from attention_doctor.targets import resolve
    kw = {k: v for k, v in marker.kwargs.items() if k not in ("target", "baseline", "allow_inconclusive")}
    target = marker.args[0] if marker.args else marker.kwargs.get("target")
    returned = item.obj(**{a: item.funcargs[a] for a in item._fixtureinfo.argnames})   # as pytest calls it
    try:
        baseline = marker.kwargs.get("baseline")
        baseline = Baseline() if baseline is None else Baseline.load(_beside(item, baseline))
        baseline.strict = baseline.strict or item.config.getoption("--attention-doctor-strict")
        if target is not None and returned is not None:
            return f"{item.originalname} returns a model and its marker names {target!r}: one of the two"
        model = resolve(target) if target is not None else returned
        if model is None:
            return f"{item.originalname} returns no model (return it, or name it: @pytest.mark.{MARK}('pkg.mod:obj'))"
        try:
            inspect.signature(examine).bind(model, name="", baseline=None, **kw)
        except TypeError as e:
            return f"attention doctor: @pytest.mark.{MARK}: {e} (it takes target, baseline, allow_inconclusive and " \
                   "examine()'s keywords)"
        return examine(model, name=_model_key(item), baseline=baseline, **kw)
    except (TargetError, ValueError) as e:   # the target, the baseline or a keyword unusable: each check's test fails with it
        return f"attention doctor: {e}"


def _beside(item, path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path(item.path).parent / p


def _keep(item, result):
    out = item.config.getoption("--attention-doctor-json")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        result.to_json(Path(out) / (re.sub(r"[^\w.\[\]-]+", "_", result.target).strip("_") + ".json"))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker(MARK)
    callspec = getattr(pyfuncitem, "callspec", None)
    if marker is None or callspec is None or CHECK not in callspec.params:
        return None
    results = pyfuncitem.config.stash[_RESULTS]
    key = _model_key(pyfuncitem)
    if key not in results:
        results[key] = _examined(pyfuncitem, marker)
        if not isinstance(results[key], str):
            _keep(pyfuncitem, results[key])
    result = results[key]
    if isinstance(result, str):
        pytest.fail(result, pytrace=False)
    _judge(pyfuncitem, marker, result, pyfuncitem.callspec.params[CHECK])
    return True


def _judge(item, marker, result, check):
    """The check's row judged against the baseline, as this test's outcome."""
    j = next(j for j in result.judged() if j.row.name == check)
    status, row = j.status.value, j.row
    if status == "expected":
        pytest.xfail(j.message())
    if status == "unexpected":
        pytest.fail(f"{j.message()}\n{result.table()}\n- {check}: {row.detail}", pytrace=False)
    if status == "inconclusive":
        allowed = marker.kwargs.get("allow_inconclusive", ())
        if allowed is True or check in allowed:
            pytest.skip(f"inconclusive (allowed): {j.message()}")
        pytest.fail(f"{j.message()} (the doctor could not perform it: never a pass)\n{result.table()}",
                    pytrace=False)
    if status == "fixed":
        item.config.stash[_FIXED].append((item.nodeid, j.message()))
        item.add_marker(pytest.mark.xfail(reason=j.message(), strict=result.baseline.strict))
        return
    if row.outcome.value == "n/a":
        pytest.skip(f"n/a: {row.reason}")
    if row.outcome.value == "warn":
        code = item.obj.__code__   # said at the test, not here
        warnings.warn_explicit(AttentionDoctorWarning(f"{check}: warn ({row.cause}): {row.detail}"),
                               AttentionDoctorWarning, code.co_filename, code.co_firstlineno)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    fixed = config.stash.get(_FIXED, [])
    if fixed:
        terminalreporter.section("attention doctor: expected by the baseline, did not happen")
        for nodeid, message in fixed:
            terminalreporter.line(f"{nodeid}: {message}")
