"""The doctor's table fits a terminal and a pull request (100 columns): outcome, cause, measured
and tolerance per check, every reason, long tolerance, experiment and thread as a numbered note."""
import re

from attention_doctor import examine
from attention_doctor.project import build_self
from attention_doctor.result import WIDTH


def _flat(text):
    return re.sub(r"\s+", " ", text)


def test_the_table_is_at_most_100_columns_and_says_every_reason():
    for overrides in ([], ["model.attention.merge=no_transpose"]):
        r = examine(build_self(overrides))
        t = r.table()
        assert max(len(line) for line in t.splitlines()) <= WIDTH == 100, t
        notes = _flat(t[t.index("\n[1] "):])
        for c in r.checks:
            for said in (c.reason, c.thread, c.experiment and f"+exp={c.experiment}"):
                assert not said or _flat(said) in notes, (c.name, said, t)
            assert re.search(rf"^{c.name}\s+{re.escape(c.outcome.value)}\s+{re.escape(c.cause or '-')}\s", t, re.M), t
    assert r["future_leak"].failed and "future_leak" in t[t.rindex("\n[") :]
