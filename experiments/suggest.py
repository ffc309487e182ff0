"""'Did you mean ...?' for a misspelt name (an experiment, a config key, a check): the nearest
known names, closest first."""
import difflib


def closest(word: str, options, n: int = 3) -> list[str]:
    """The options nearest to `word`, closest first: difflib's similarity ratio >= 0.6 and within
    0.1 of the best one's."""
    scored = sorted(((difflib.SequenceMatcher(None, word, str(o)).ratio(), str(o)) for o in options),
                    key=lambda t: -t[0])
    best = scored[0][0] if scored else 0
    return [o for r, o in scored[:n] if r >= 0.6 and r >= best - 0.1]


def did_you_mean(word: str, options) -> str:
    """' (did you mean A or B?)', or '' when nothing is near."""
    near = closest(word, options)
    return f" (did you mean {' or '.join(near)}?)" if near else ""
