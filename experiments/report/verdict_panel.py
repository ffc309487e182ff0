"""The verdict panel of an experiment's figure: every check of its signature as one strip, the
value measured on the failure (red) and on its control (blue) in each seed, against the
threshold (dashed), the side where the signature holds shaded. Drawn from the runs' verdicts
(summary.json), the same way for every experiment, so a signature measured after training (a
cached forward, a float16 pass) is seen even where the training curves lie on top of each other."""
import math
import textwrap

from experiments.report import seeds

FAILURE, CONTROL = "C3", "C0"       # the curves' colours
SEED_MARKERS = "os^Dv"
SHAPES = dict(zip(SEED_MARKERS, "○□△◇▽"))  # the markers, as the header names them
STATUSES = ("completed", "diverged", "error")
MIN_STRIPS = 6
WRAP = 78  # characters per line of a strip's title: the panel's width at 8 pt
WHAT = {"delta": "failure − control", "ratio": "failure / control",
        "plateau": "steps on the plateau, failure / control", "near": "relative error to the prediction"}


def threshold(check: dict):
    """(op, value) of a check from its verdict's `expected` text ('>= 1', '== diverged'), or None."""
    expected = check.get("expected") or ""
    if check.get("kind") == "status" and expected.startswith("=="):
        return "==", expected[2:].strip()
    return seeds.threshold(expected)


def _num(v):
    if isinstance(v, bool):
        return float(v)
    return float(v) if isinstance(v, (int, float)) else None


def checks_by_name(verdicts: list[tuple]) -> list[dict]:
    """[(seed, verdict)] -> one dict per check, in the signature's order:
    {check (of the first seed), seeds, failure: [(value, passed)], control: [(value, passed)] or None}."""
    out: dict[str, dict] = {}
    has_control = any("control_status" in (v or {}) for _, v in verdicts)
    for seed, v in verdicts:
        for c in (v or {}).get("checks", []):
            d = out.setdefault(c["name"], {"check": c, "seeds": [], "failure": [], "control": [] if has_control else None})
            d["seeds"].append(seed)
            d["failure"].append((c.get("measured"), bool(c.get("passed"))))
            if has_control:
                d["control"].append((c.get("control"), bool(c.get("control_passed"))))
    return list(out.values())


def _scale(ax, values: list[float]):
    """log where positive values span more than 100x, symlog where signed (or zero) ones do."""
    finite = [v for v in values if math.isfinite(v)]
    nonzero = [abs(v) for v in finite if v != 0]
    if len(nonzero) < 2 or max(nonzero) / min(nonzero) <= 100:
        return
    if all(v > 0 for v in finite):
        ax.set_xscale("log")
    else:
        ax.set_xscale("symlog", linthresh=min(nonzero))


def _strip(ax, d: dict, markers: dict):
    c = d["check"]
    thr = threshold(c)
    rows = [(d["failure"], FAILURE, 1.0)] + ([(d["control"], CONTROL, 0.0)] if d["control"] is not None else [])
    status = c.get("kind") == "status"
    placed = []  # (x or a non-number, y, colour, marker, passed)
    for pairs, colour, y0 in rows:
        n = len(pairs)
        for i, ((value, passed), seed) in enumerate(zip(pairs, d["seeds"])):
            y = y0 + (i - (n - 1) / 2) * min(0.22, 0.66 / max(n - 1, 1))  # rows stay apart
            x = float(STATUSES.index(value)) if status and value in STATUSES else _num(value)
            placed.append((x if x is not None else value, y, colour, markers[seed], passed))
    nums = [p[0] for p in placed if isinstance(p[0], float)]
    if status:
        ax.set_xlim(-0.5, len(STATUSES) - 0.5)
        ax.set_xticks(range(len(STATUSES)), STATUSES)
        if thr and thr[1] in STATUSES:
            k = STATUSES.index(thr[1])
            ax.axvspan(k - 0.5, k + 0.5, color="0.85", zorder=0)
    else:
        t = thr[1] if thr else None
        _scale(ax, nums + ([t] if t is not None else []))
        finite = [v for v in nums if math.isfinite(v)] + ([t] if t is not None else [])
        if finite:
            ax.plot(finite, [0.5] * len(finite), alpha=0)  # the limits hold every value and the threshold
            ax.margins(x=0.12)
        if t is not None:
            lo, hi = ax.get_xlim()
            ax.axvspan(t, hi, color="0.85", zorder=0) if thr[0].startswith(">") else ax.axvspan(lo, t, color="0.85", zorder=0)
            ax.axvline(t, color="k", ls="--", lw=1)
            ax.set_xlim(lo, hi)
    lo, hi = ax.get_xlim()
    named: dict = {}  # (row, label) -> (x, [y]): a value off the axis, named once per row
    for x, y, colour, marker, passed in placed:
        style = dict(marker=marker, ms=6, mfc=colour if passed else "white", mec=colour, mew=1.5, ls="none", zorder=3)
        if isinstance(x, float) and math.isfinite(x):
            ax.plot([x], [y], **style)
        elif x is None:  # the run did not measure it (no such metric on the control, say)
            named.setdefault((colour, "not measured"), (lo, []))[1].append(y)
        else:  # inf / nan at the edge its sign points to
            label = str(x) if not isinstance(x, float) else "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"
            at = hi if isinstance(x, float) and x > 0 else lo
            ax.plot([at], [y], clip_on=False, **style)
            named.setdefault((colour, label), (at, []))[1].append(y)
    for (colour, label), (at, ys) in named.items():
        right = at == hi
        ax.annotate(label, (at, sum(ys) / len(ys)), xytext=(-9 if right else 9, 0), textcoords="offset points",
                    fontsize=7, ha="right" if right else "left", va="center", color=colour)
    ax.set_ylim(-0.55, 1.55) if d["control"] is not None else ax.set_ylim(0.45, 1.55)
    ax.set_yticks([1.0, 0.0][:len(rows)], ["failure", "control"][:len(rows)], fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    if not status and ax.get_xscale() == "linear":
        ax.locator_params(axis="x", nbins=5)  # few ticks: each is artists to make and text to draw
    ok = sum(p for _, p in d["failure"])
    mark = "" if thr is None else "✓ " if ok == len(d["failure"]) else "✗ "
    gate = " (not gated)" if c.get("report_only") else ""
    holds = f": holds in {ok} of {len(d['failure'])}" if thr is not None else ": reported"
    if c.get("kind") in WHAT:
        ax.set_xlabel(WHAT[c["kind"]], fontsize=7, labelpad=1)
    rule = f"; signature: {thr[0]} {thr[1] if isinstance(thr[1], str) else f'{thr[1]:g}'}" if thr else ""
    ax.set_title(textwrap.fill(f"{mark}{c['name']}{gate}{holds}{rule}", WRAP),
                 fontsize=8, loc="left", y=1.0)  # y given: not re-placed at each draw (costly)


def draw(fig, slot, verdicts: list[tuple]):
    """The verdict panel into gridspec `slot`: one strip per check, the header naming the rates."""
    verdicts = sorted(verdicts, key=lambda sv: (sv[0] is None, sv[0] or 0))
    checks = checks_by_name(verdicts)
    measurable = [d for d in checks if not d["check"].get("not_measurable")]
    n = len(verdicts)
    markers = {s: SEED_MARKERS[i % len(SEED_MARKERS)] for i, (s, _) in enumerate(verdicts)}
    k = sum(bool((v or {}).get("reproduced")) for _, v in verdicts)
    broken = [bool((v or {}).get("signature_broken")) for _, v in verdicts if "control_status" in (v or {})]
    legend = "  ".join(f"{SHAPES[m]} seed {s}" for s, m in markers.items())
    head = (f"verdict: reproduced in {k} of {n} seed(s)"
            + (f"; signature on the control in {sum(broken)} of {len(broken)}" if broken else "")
            + f"\n{legend}" + ("; " if n < 4 else "\n")   # five seeds' shapes fill the line
            + "filled: the check holds; shaded: its signature side")
    lines = head.count("\n") + 1
    slots = max(len(measurable), MIN_STRIPS)  # strips of one height in every figure; spare slots stay empty
    # room between strips for a two-line title above and an x label below (the figure's layout is fixed)
    grid = slot.subgridspec(slots + 1, 1, height_ratios=[0.32 * lines] + [1] * slots, hspace=2.3)
    top = fig.add_subplot(grid[0, 0])
    top.set_axis_off()
    off = [d["check"]["name"] for d in checks if d["check"].get("not_measurable")]
    if off:
        head += "\n" + textwrap.fill("not measurable on this data: " + "; ".join(off), WRAP + 10)
    top.text(0, 1, head, fontsize=8, va="top", ha="left", transform=top.transAxes).set_in_layout(False)
    if not measurable:
        ax = fig.add_subplot(grid[1, 0])
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no check to show", ha="center", va="center", fontsize=8)
    for i, d in enumerate(measurable):
        _strip(fig.add_subplot(grid[i + 1, 0]), d, markers)
