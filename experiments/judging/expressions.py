"""Check thresholds as small arithmetic expressions (`0.9 * ln_V`, `0.5 * sqrt(d_k)`), read with
`ast`: numbers, the named constants, + - * / **, unary minus, and log, sqrt, min, max. Anything
else (attributes, subscripts, other calls, unknown names) is a ValueError of one line, raised when
the expression is parsed - in preflight, before any step is trained."""
import ast
import math
import operator

# the names a check may use; judging.verdict's context gives their values for a run
NAMES = ("ln_V", "V", "d_k", "steps", "steps_done", "log_every",
         "floor",    # the no-attention floor's final loss (exp.floor; text versions)
         "control",  # the control's final loss (exp.loss_metric): `floor - control` is what attention gains it
         "gain")     # attention's gain on this corpus and seed: floor - the healthy text model's final loss.
                     # A text threshold on a loss is a multiple of it (or of floor, control), never nats:
                     # a corpus with less to predict from context has a smaller gain, not another bug
FUNCTIONS = {"log": math.log, "sqrt": math.sqrt, "min": min, "max": max}
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.Pow: operator.pow}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class Expression:
    """A parsed expression; `value(names)` evaluates it."""

    def __init__(self, text):
        self.text = str(text)
        try:
            tree = ast.parse(self.text.strip(), mode="eval")
        except SyntaxError:
            raise ValueError(f"expression {self.text!r} is not arithmetic") from None
        self._check(tree.body)
        self.tree = tree.body

    def _check(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return
        if isinstance(node, ast.Name):
            if node.id not in NAMES:
                raise ValueError(f"expression {self.text!r}: unknown name {node.id!r} "
                                 f"(known: {', '.join(NAMES)})")
            return
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            self._check(node.left)
            self._check(node.right)
            return
        if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            self._check(node.operand)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS \
                and node.args and not node.keywords:
            for a in node.args:
                self._check(a)
            return
        raise ValueError(f"expression {self.text!r}: {ast.unparse(node)!r} is not allowed "
                         f"(numbers, {', '.join(NAMES)}, + - * / **, {', '.join(FUNCTIONS)})")

    def value(self, names: dict) -> float:
        return float(self._eval(self.tree, names))

    def _eval(self, node, names):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"expression {self.text!r}: {node.id} is not known for this run")
            return names[node.id]
        if isinstance(node, ast.BinOp):
            return BINARY[type(node.op)](self._eval(node.left, names), self._eval(node.right, names))
        if isinstance(node, ast.UnaryOp):
            return UNARY[type(node.op)](self._eval(node.operand, names))
        return FUNCTIONS[node.func.id](*(self._eval(a, names) for a in node.args))


def names_used(x) -> set[str]:
    """The names an expression (or a number: none) reads; ValueError as parse."""
    e = parse(x) if x is not None else 0.0
    return set() if isinstance(e, float) else {n.id for n in ast.walk(e.tree) if isinstance(n, ast.Name)} - set(FUNCTIONS)


def parse(x) -> Expression | float:
    """A number stays a number; text is parsed (ValueError on anything outside the grammar)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return Expression(x)


def evaluate(x, names: dict) -> float:
    e = parse(x)
    return e if isinstance(e, float) else e.value(names)
