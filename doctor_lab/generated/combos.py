"""The (style, bug) combinations and what the doctor must say about each, derived from the records
alone: a style is one value per axis, valid when every value's `needs` are given by the style and
none of its `excludes` is; a bug fits a style the same way. Its expected outcome: the bug's rows
(moved by a value's `moves`, with the rows its `when` adds on the style's features), and the checks
the style's values make n/a. Torch-free."""
import itertools
import random
from dataclasses import dataclass

from doctor_lab.generated.records import ALWAYS_NA, AXES, BUGS, VALUES, Expect, Value

HEALTHY = "healthy"


@dataclass(frozen=True)
class Style:
    values: tuple[Value, ...]   # one per axis, in AXES' order

    @property
    def features(self) -> frozenset[str]:
        return frozenset().union(*(val.gives for val in self.values))

    def __getitem__(self, axis: str) -> str:
        return next(val.name for val in self.values if val.axis == axis)

    @property
    def id(self) -> str:
        return ",".join(val.name for val in self.values)

    @classmethod
    def parse(cls, text: str) -> "Style":
        """From its id (the values in AXES' order, comma-separated)."""
        names = text.split(",")
        if len(names) != len(AXES):
            raise ValueError(f"a style names {len(AXES)} values ({', '.join(AXES)}), got {len(names)}")
        return cls(tuple(VALUES[f"{axis}={name}"] for axis, name in zip(AXES, names)))


def fits(needs, excludes, features) -> bool:
    return needs <= features and not (excludes & features)


def valid(style: Style) -> bool:
    f = style.features
    return all(fits(val.needs, val.excludes, f) for val in style.values)


def bug_fits(style: Style, bug: str) -> bool:
    if bug == HEALTHY:
        return True
    rec = BUGS[bug]
    f = style.features
    return fits(rec.needs, rec.excludes, f) and (not rec.needs_one_of or any(alt <= f for alt in rec.needs_one_of))


def all_styles() -> list[Style]:
    return [s for s in (Style(vals) for vals in itertools.product(*AXES.values())) if valid(s)]


@dataclass(frozen=True)
class Expected:
    """What the doctor must say: `rows` that must come (a bug's), `na` checks n/a by construction;
    healthy (no rows): no check may fail."""
    rows: tuple[Expect, ...]
    na: tuple[str, ...]

    @property
    def checks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([r.check for r in self.rows] + list(self.na)))


def expected(style: Style, bug: str) -> Expected:
    na = tuple(dict.fromkeys(ALWAYS_NA + tuple(c for val in style.values for c in val.na)))
    if bug == HEALTHY:
        return Expected((), na)
    rec = BUGS[bug]
    rows = rec.expects
    for val in style.values:
        rows = val.moves.get(bug, rows)
    f = style.features
    rows = rows + tuple(e for feats, more in rec.when if feats <= f for e in more)
    return Expected(rows, tuple(c for c in na if c not in {r.check for r in rows}))


@dataclass(frozen=True)
class Combo:
    style: Style
    bug: str

    @property
    def id(self) -> str:
        return f"{self.style.id}/{self.bug}"

    @property
    def expected(self) -> Expected:
        return expected(self.style, self.bug)

    @classmethod
    def parse(cls, text: str) -> "Combo":
        style, bug = text.rsplit("/", 1)
        if bug != HEALTHY and bug not in BUGS:
            raise ValueError(f"unknown bug {bug!r}")
        return cls(Style.parse(style), bug)


def population() -> dict[str, list[Style]]:
    """bug (and healthy) -> the valid styles it fits."""
    styles = all_styles()
    return {bug: [s for s in styles if bug_fits(s, bug)] for bug in (HEALTHY, *BUGS)}


def sample(n: int, seed: int = 0, healthy_share: float = 0.2) -> list[Combo]:
    """n combinations: healthy_share of them healthy, the rest spread evenly over the bugs; each
    bug's styles drawn without replacement, seeded (the same n and seed give the same bed), in a
    seeded shuffled order (a run cut short is a uniform part of it)."""
    rng = random.Random(seed)
    pop = population()
    n_healthy = round(n * healthy_share)
    per_bug, extra = divmod(n - n_healthy, len(BUGS))
    counts = {HEALTHY: n_healthy, **{bug: per_bug + (i < extra) for i, bug in enumerate(BUGS)}}
    out = []
    for bug, k in counts.items():
        out += [Combo(s, bug) for s in rng.sample(pop[bug], min(k, len(pop[bug])))]
    rng.shuffle(out)
    return out


def healthy_cover(n: int, seed: int = 0) -> list[Style]:
    """n valid styles, seeded, in which every value of every axis appears: greedily the style that
    adds the most values not yet seen (ties: the seeded shuffle's order), then the shuffle's next
    ones. ValueError where n is too few to cover every value."""
    rng = random.Random(seed)
    pool = all_styles()
    rng.shuffle(pool)
    picked, seen = [], set()
    every = set(VALUES)
    while seen != every:
        best = max(pool, key=lambda s: len({v.key for v in s.values} - seen))
        picked.append(best)
        seen |= {v.key for v in best.values}
    if n < len(picked):
        raise ValueError(f"{n} styles cannot hold every axis value ({len(picked)} needed, seed {seed})")
    chosen = {s.id for s in picked}
    return picked + [s for s in pool if s.id not in chosen][:n - len(picked)]
