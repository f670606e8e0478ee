"""RocketMQ 4.x SQL92 message filter (``MessageSelector.bySql``), evaluated on message properties.

Follows Apache RocketMQ 4.9.x: the grammar of ``filter/.../parser/SelectorParser.jj``, the value
semantics of ``filter/.../expression/{ComparisonExpression, LogicExpression, UnaryExpression,
ConstantExpression, PropertyExpression}.java`` and the broker's use of them in
``broker/.../filter/{MessageEvaluationContext, ExpressionMessageFilter}.java``: a property is the
message's property string (``TAGS``, ``KEYS`` and user properties alike) or NULL when absent; a
message matches only if the expression evaluates to TRUE, and an evaluation that throws in Java
(a property that is not a number where one is needed, ...) does not match.

One deliberate difference: Java's parser stops after the first complete expression and silently
ignores what follows (``a = 1 b = 2`` filters on ``a = 1``); here trailing tokens are an error.

An expression compiles once into nested closures; ``matches`` calls them with the properties.
"""

from __future__ import annotations

import enum
import functools
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["FilterSyntaxError", "Sql92Filter", "compile_sql92"]

Props = Mapping[str, str]
Evaluator = Callable[[Props], object]


class FilterSyntaxError(ValueError):
    """An expression RocketMQ's SelectorParser rejects; the message says what and where."""


class Sql92Filter:
    """A compiled SQL92 filter; get one from :func:`compile_sql92`."""

    __slots__ = ("_evaluate", "expression")

    def __init__(self, expression: str, evaluate: Evaluator) -> None:
        self.expression = expression
        self._evaluate = evaluate

    def matches(self, props: Props) -> bool:
        """True only if the expression evaluates to TRUE on these message properties."""
        try:
            return self._evaluate(props) is True
        except _EvaluationError:
            # ExpressionMessageFilter.isMatchedByCommitLog: an exception means no match.
            return False

    def __repr__(self) -> str:
        return f"Sql92Filter({self.expression!r})"


@functools.lru_cache(maxsize=512)
def compile_sql92(expression: str) -> Sql92Filter:
    """Parse and compile ``expression``; raises FilterSyntaxError where RocketMQ would refuse it."""
    try:
        evaluate = _Parser(expression).parse()
    except _Invalid as invalid:
        line, column = _line_and_column(expression, invalid.position)
        raise FilterSyntaxError(
            f"invalid SQL92 expression at line {line}, column {column}: {invalid.message}"
        ) from None
    return Sql92Filter(expression, evaluate)


# --- Java values ---------------------------------------------------------------------------
#
# Runtime values model the Java objects the filter sees: str = String (every property value),
# bool = Boolean, int = Integer, _Long = Long, float = Double, None = null. Integers only ever
# come from literals, whose Java type the literal's size decides
# (ConstantExpression.createFromDecimal).


class _Long(int):
    """A Java Long: a decimal literal outside the int range, or its negation."""

    __slots__ = ()


class _EvaluationError(Exception):
    """What throws in Java while evaluating (NumberFormatException, ClassCastException)."""


_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def _parse_java_integer(text: str, low: int, high: int) -> int:
    # Integer.parseInt / Long.parseLong: an optional sign, then (Unicode) decimal digits only.
    sign = text[:1] if text[:1] in ("+", "-") else ""
    digits = text[len(sign) :]
    significant = digits.lstrip("0")  # Java allows any number of leading zeros
    if digits.isdecimal() and len(significant) <= 19:
        value = int(significant or "0")
        if sign == "-":
            value = -value
        if low <= value <= high:
            return value
    raise _EvaluationError(f"not a Java {'int' if high == _INT_MAX else 'long'}: {text!r}")


def _java_int(text: str) -> int:
    if len(text) < 10 and text.isascii() and text.isdigit():  # the common case, in range
        return int(text)
    return _parse_java_integer(text, _INT_MIN, _INT_MAX)


def _java_long(text: str) -> int:
    if len(text) < 19 and text.isascii() and text.isdigit():
        return int(text)
    return _parse_java_integer(text, _LONG_MIN, _LONG_MAX)


# Double.valueOf: String.trim() blanks around; NaN, Infinity, decimal or hex forms, optional
# type suffix; ASCII digits only.
_JAVA_TRIMMED = "".join(map(chr, range(0x21)))
_JAVA_DOUBLE = re.compile(
    r"""(?P<sign>[+-]?)(?:
        (?P<nan>NaN)
      | (?P<infinity>Infinity)
      | (?P<hex>0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?
      | (?P<decimal>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?
    )""",
    re.VERBOSE,
)


def _java_double(text: str) -> float:
    if text.isascii() and text.isdigit():
        return float(text)
    match = _JAVA_DOUBLE.fullmatch(text.strip(_JAVA_TRIMMED))
    if match is None:
        raise _EvaluationError(f"not a Java double: {text!r}")
    sign = match["sign"]
    if match["nan"]:
        return math.nan
    if match["infinity"]:
        return -math.inf if sign == "-" else math.inf
    if match["hex"]:
        return float.fromhex(sign + match["hex"])
    return float(sign + match["decimal"])


def _java_boolean(text: str) -> bool:
    return text.lower() == "true"  # Boolean.valueOf(String)


_FROM_STRING: dict[type, Callable[[str], object]] = {
    bool: _java_boolean,
    int: _java_int,
    _Long: _java_long,
    float: _java_double,
}


def _compare_doubles(x: float, y: float) -> int:
    """Double.compare: -0.0 < 0.0, and NaN equals itself and is above everything."""
    if x < y:
        return -1
    if x > y:
        return 1
    x_key = (1, 0.0) if math.isnan(x) else (0, math.copysign(1.0, x))
    y_key = (1, 0.0) if math.isnan(y) else (0, math.copysign(1.0, y))
    return (x_key > y_key) - (x_key < y_key)


def _java_compare(left: object, right: object) -> int:
    """ComparisonExpression.__compare, string conversion on (SelectorParser.parse sets it)."""
    left_type, right_type = type(left), type(right)
    if left_type is not right_type:
        if left_type is str:
            left = _FROM_STRING[right_type](left)
        elif right_type is str:
            if left_type is bool:
                # Java casts the Boolean itself to String here: a ClassCastException.
                raise _EvaluationError("a boolean cannot be compared with a string")
            right = _FROM_STRING[left_type](right)
        elif left_type is bool or right_type is bool:
            return -1  # a boolean and a number: Java answers "less", never equal
        elif left_type is float or right_type is float:
            left, right = float(left), float(right)
    if type(left) is float:
        return _compare_doubles(left, right)
    return (left > right) - (left < right)


# --- evaluators ----------------------------------------------------------------------------
#
# Each takes the properties and returns True, False or None (Java's null, "unknown").


def _constant(value: object) -> Evaluator:
    return lambda props: value


def _property(name: str) -> Evaluator:
    def property_value(props: Props) -> object:
        return props.get(name)

    return property_value


def _boolean_cast(name: str) -> Evaluator:
    # UnaryExpression.createBooleanCast: a property used as a condition; a String is never TRUE.
    def boolean_cast(props: Props) -> object:
        return None if props.get(name) is None else False

    return boolean_cast


def _not(operand: Evaluator) -> Evaluator:
    def not_(props: Props) -> object:
        value = operand(props)
        return None if value is None else not value

    return not_


def _discard(operand: Evaluator) -> Evaluator:
    # Unary minus of something that is not a number literal: Java evaluates it, then yields null.
    def negate(props: Props) -> object:
        operand(props)
        return None

    return negate


def _and(operands: tuple[Evaluator, ...]) -> Evaluator:
    # LogicExpression.createAND, flattened: the first FALSE wins, else any NULL gives NULL.
    if len(operands) == 2:
        first, second = operands

        def and2(props: Props) -> object:
            left = first(props)
            if left is False:
                return False
            right = second(props)
            if right is False:
                return False
            return None if left is None or right is None else True

        return and2

    def and_n(props: Props) -> object:
        unknown = False
        for operand in operands:
            value = operand(props)
            if value is False:
                return False
            if value is None:
                unknown = True
        return None if unknown else True

    return and_n


def _or(operands: tuple[Evaluator, ...]) -> Evaluator:
    # LogicExpression.createOR, flattened: the first TRUE wins, else any NULL gives NULL.
    if len(operands) == 2:
        first, second = operands

        def or2(props: Props) -> object:
            left = first(props)
            if left is True:
                return True
            right = second(props)
            if right is True:
                return True
            return None if left is None or right is None else False

        return or2

    def or_n(props: Props) -> object:
        unknown = False
        for operand in operands:
            value = operand(props)
            if value is True:
                return True
            if value is None:
                unknown = True
        return None if unknown else False

    return or_n


def _is_null(operand: Evaluator, negated: bool) -> Evaluator:
    def is_null(props: Props) -> object:
        return (operand(props) is None) is not negated

    return is_null


def _in(name: str, values: frozenset[str], negated: bool) -> Evaluator:
    def in_(props: Props) -> object:
        value = props.get(name)
        return None if value is None else (value in values) is not negated

    return in_


_ORDERINGS: dict[str, Callable[[object, object], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_MIRRORED = {">": "<", ">=": "<=", "<": ">", "<=": ">="}
_NUMBER_TYPES = (int, _Long, float)


def _ordering(symbol: str, left: _Expr, right: _Expr) -> Evaluator:
    """``left <symbol> right`` for > >= < <=, as ComparisonExpression.evaluate does it."""
    if left.kind is _Kind.PROPERTY and type(right.value) in _NUMBER_TYPES:
        return _property_ordering(symbol, left.name, right.value)
    if right.kind is _Kind.PROPERTY and type(left.value) in _NUMBER_TYPES:
        return _property_ordering(_MIRRORED[symbol], right.name, left.value)

    test = _ORDERINGS[symbol]
    first, second = left.evaluate, right.evaluate

    def ordering(props: Props) -> object:
        left_value = first(props)
        if left_value is None:
            return None
        right_value = second(props)
        if right_value is None:
            return None
        if type(left_value) is str and type(right_value) is str:
            # Two strings are ordered as doubles, or the evaluation fails.
            order = _compare_doubles(_java_double(left_value), _java_double(right_value))
        else:
            order = _java_compare(left_value, right_value)
        return test(order, 0)

    return ordering


def _property_ordering(symbol: str, name: str, number: object) -> Evaluator:
    # The property's string is read as the number literal's Java type: Integer.valueOf for an
    # int literal (so "2.5" or "3000000000" fail), Long.valueOf or Double.valueOf otherwise.
    test = _ORDERINGS[symbol]
    if type(number) is float:
        nan_result = test(1, 0)  # literals are never NaN; a NaN property orders above them
        isnan = math.isnan

        def property_vs_double(props: Props) -> object:
            text = props.get(name)
            if text is None:
                return None
            value = _java_double(text)
            return nan_result if isnan(value) else test(value, number)

        return property_vs_double

    convert = _java_int if type(number) is int else _java_long

    def property_vs_integer(props: Props) -> object:
        text = props.get(name)
        if text is None:
            return None
        return test(convert(text), number)

    return property_vs_integer


def _equality(left: _Expr, right: _Expr) -> Evaluator:
    """``left = right`` as ComparisonExpression.doCreateEqual evaluates it."""
    # null = null is TRUE, null = x is NULL, but x = null is FALSE (sic).
    if left.kind is _Kind.PROPERTY and type(right.value) in (str, bool, *_NUMBER_TYPES):
        return _property_equality(left.name, right.value, missing=None)
    if right.kind is _Kind.PROPERTY and type(left.value) in (str, *_NUMBER_TYPES):
        return _property_equality(right.name, left.value, missing=False)

    first, second = left.evaluate, right.evaluate

    def equality(props: Props) -> object:
        left_value = first(props)
        right_value = second(props)
        if left_value is None:
            return True if right_value is None else None
        if right_value is None:
            return False
        return _java_compare(left_value, right_value) == 0

    return equality


def _property_equality(name: str, constant: object, missing: object) -> Evaluator:
    if type(constant) is str:

        def property_equals_string(props: Props) -> object:
            text = props.get(name)
            return missing if text is None else text == constant

        return property_equals_string

    convert = _FROM_STRING[type(constant)]

    def property_equals_value(props: Props) -> object:
        text = props.get(name)
        return missing if text is None else convert(text) == constant

    return property_equals_value


# --- tokens --------------------------------------------------------------------------------


class _Invalid(Exception):
    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.message = message
        self.position = position


class _Token(NamedTuple):
    kind: str  # a keyword, an operator's text, DECIMAL, FLOAT, STRING, ID or EOF
    text: str
    start: int
    end: int


_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})

# SelectorParser.jj's tokens. A "--" comment may also end the input (Java wants a line break
# after it, but then ignores the tokens it makes of the comment, see the module docstring).
_TOKEN = re.compile(
    r"""
      (?P<SKIP>[ \t\n\r\f]+ | --[^\n\r]* | /\*.*?\*/)
    | (?P<FLOAT>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?
              | \.[0-9]+(?:[eE][+-]?[0-9]+)?
              | [0-9]+[eE][+-]?[0-9]+)
    | (?P<DECIMAL>0|[1-9][0-9]*[lL]?)
    | (?P<STRING>'(?:''|[^'])*')
    | (?P<ID>[A-Za-z_$][A-Za-z0-9_$]*)
    | (?P<OPERATOR><>|<=|>=|[=<>(),+-])
    """,
    re.VERBOSE | re.DOTALL,
)


def _tokenize(source: str) -> list[_Token]:
    tokens = []
    position = 0
    while position < len(source):
        match = _TOKEN.match(source, position)
        if match is None:
            if source.startswith("'", position):
                raise _Invalid("unterminated string literal", position)
            if source.startswith("/*", position):
                raise _Invalid("unterminated /* comment", position)
            raise _Invalid(f"unexpected character {source[position]!r}", position)
        kind, text = match.lastgroup, match[0]
        if kind == "ID" and text.upper() in _KEYWORDS:
            kind = text.upper()
        elif kind == "OPERATOR":
            kind = text
        if kind != "SKIP":
            tokens.append(_Token(kind, text, position, match.end()))
        position = match.end()
    tokens.append(_Token("EOF", "", len(source), len(source)))
    return tokens


def _line_and_column(source: str, position: int) -> tuple[int, int]:
    line, line_start = 1, 0
    for line_break in re.finditer(r"\r\n|\r|\n", source[:position]):
        line, line_start = line + 1, line_break.end()
    return line, position - line_start + 1


# --- parser --------------------------------------------------------------------------------


class _Kind(enum.Enum):
    """The Java expression classes the parser's checks tell apart."""

    LITERAL = enum.auto()  # ConstantExpression; TRUE, FALSE, NULL are also boolean
    PROPERTY = enum.auto()  # PropertyExpression
    BOOLEAN = enum.auto()  # comparisons, AND, OR, NOT, IN, boolean casts
    VALUE = enum.auto()  # unary minus: neither a constant nor a boolean


_UNKNOWN = object()


@dataclass(frozen=True, slots=True)
class _Expr:
    kind: _Kind
    evaluate: Evaluator
    start: int
    end: int
    value: object = _UNKNOWN  # known before any message: a literal or a negated literal
    name: str = ""  # a property's name
    logic: tuple[str, tuple[Evaluator, ...]] | None = None  # AND/OR and its operands

    @property
    def is_boolean(self) -> bool:
        return self.kind is _Kind.BOOLEAN or (
            self.kind is _Kind.LITERAL and (self.value is None or type(self.value) is bool)
        )


class _Parser:
    """Recursive descent over SelectorParser.jj's grammar, with the checks its actions make.

    Precedence, loosest first: OR; AND; = <> IS [NOT] NULL; > >= < <= [NOT] BETWEEN [NOT] IN;
    unary + - NOT (so ``NOT a = 'x'`` means ``(NOT a) = 'x'``).
    """

    def __init__(self, source: str) -> None:
        self._source = source
        self._tokens = _tokenize(source)
        self._index = 0

    def parse(self) -> Evaluator:
        try:
            expr = self._or_expression()
        except RecursionError:
            raise _Invalid("expression is nested too deeply", 0) from None
        token = self._peek()
        if token.kind != "EOF":
            raise _Invalid(
                f"unexpected {self._describe(token)} after a complete expression", token.start
            )
        return self._as_boolean(expr).evaluate

    # tokens

    def _peek(self, ahead: int = 0) -> _Token:
        return self._tokens[min(self._index + ahead, len(self._tokens) - 1)]

    def _advance(self) -> _Token:
        token = self._tokens[self._index]
        self._index += 1
        return token

    def _expect(self, kind: str, wanted: str) -> _Token:
        token = self._peek()
        if token.kind != kind:
            raise _Invalid(f"expected {wanted} but found {self._describe(token)}", token.start)
        return self._advance()

    @property
    def _end(self) -> int:
        return self._tokens[self._index - 1].end

    @staticmethod
    def _describe(token: _Token) -> str:
        return "end of expression" if token.kind == "EOF" else repr(token.text)

    def _quote(self, expr: _Expr) -> str:
        return f"`{self._source[expr.start : expr.end]}`"

    # grammar

    def _or_expression(self) -> _Expr:
        left = self._and_expression()
        while self._peek().kind == "OR":
            self._advance()
            left = self._logic("OR", left, self._and_expression())
        return left

    def _and_expression(self) -> _Expr:
        left = self._equality_expression()
        while self._peek().kind == "AND":
            self._advance()
            left = self._logic("AND", left, self._equality_expression())
        return left

    def _equality_expression(self) -> _Expr:
        left = self._comparison_expression()
        while True:
            kind = self._peek().kind
            if kind == "=":
                self._advance()
                left = self._equal(left, self._comparison_expression())
            elif kind == "<>":
                self._advance()
                equal = self._equal(left, self._comparison_expression())
                left = self._boolean(_not(equal.evaluate), equal.start)
            elif kind == "IS":
                self._advance()
                negated = self._peek().kind == "NOT"
                if negated:
                    self._advance()
                self._expect("NULL", "NULL or NOT NULL after IS")
                left = self._boolean(_is_null(left.evaluate, negated), left.start)
            else:
                return left

    def _comparison_expression(self) -> _Expr:
        left = self._unary_expression()
        while True:
            token = self._peek()
            negated = token.kind == "NOT"
            kind = self._peek(1).kind if negated else token.kind
            if negated and kind not in ("BETWEEN", "IN"):
                raise _Invalid(
                    f"expected BETWEEN or IN after NOT but found {self._describe(self._peek(1))}",
                    self._peek(1).start,
                )
            if kind in _ORDERINGS:
                self._advance()
                left = self._compare(kind, left, self._unary_expression())
            elif kind == "BETWEEN":
                self._index += 2 if negated else 1
                left = self._between(left, negated)
            elif kind == "IN":
                self._index += 2 if negated else 1
                left = self._in(left, negated)
            else:
                return left

    def _unary_expression(self) -> _Expr:
        token = self._peek()
        if token.kind == "+":
            self._advance()
            return self._unary_expression()
        if token.kind == "-":
            self._advance()
            return self._negate(self._unary_expression(), token.start)
        if token.kind == "NOT":
            self._advance()
            operand = self._as_boolean(self._unary_expression())
            return self._boolean(_not(operand.evaluate), token.start)
        return self._primary_expression()

    def _primary_expression(self) -> _Expr:
        token = self._peek()
        if token.kind == "(":
            self._advance()
            expr = self._or_expression()
            self._expect(")", "')'")
            return expr
        if token.kind == "ID":
            self._advance()
            name = token.text
            return _Expr(_Kind.PROPERTY, _property(name), token.start, token.end, name=name)
        if token.kind in ("STRING", "DECIMAL", "FLOAT", "TRUE", "FALSE", "NULL"):
            self._advance()
            value = self._literal_value(token)
            return _Expr(_Kind.LITERAL, _constant(value), token.start, token.end, value=value)
        raise _Invalid(
            f"expected a value, a property or '(' but found {self._describe(token)}", token.start
        )

    def _literal_value(self, token: _Token) -> object:
        text = token.text
        if token.kind == "STRING":
            return text[1:-1].replace("''", "'")
        if token.kind == "DECIMAL":
            # ConstantExpression.createFromDecimal: an int if it fits, else a long, else an error.
            digits = text.rstrip("lL")  # no leading zeros: the grammar makes "007" three tokens
            value = int(digits) if len(digits) <= 19 else _LONG_MAX + 1
            if value > _LONG_MAX:
                raise _Invalid(f"integer {text} is out of the Java long range", token.start)
            return value if value <= _INT_MAX else _Long(value)
        if token.kind == "FLOAT":
            # ConstantExpression.createFloat refuses infinity and anything below Double.MIN_VALUE,
            # which includes 0.0 itself.
            value = float(text)
            if not 0.0 < value < math.inf:
                raise _Invalid(
                    f"float {text} is outside 4.9E-324 .. 1.7976931348623157E308", token.start
                )
            return value
        return {"TRUE": True, "FALSE": False, "NULL": None}[token.kind]

    def _string_list(self) -> frozenset[str]:
        self._expect("(", "'(' after IN")
        values = []
        while True:
            token = self._expect("STRING", "a string literal in the IN list")
            values.append(self._literal_value(token))
            if self._peek().kind != ",":
                break
            self._advance()
        self._expect(")", "',' or ')' in the IN list")
        return frozenset(values)

    # expressions, with the checks of ComparisonExpression's and SelectorParser's factories

    def _boolean(self, evaluate: Evaluator, start: int) -> _Expr:
        return _Expr(_Kind.BOOLEAN, evaluate, start, self._end)

    def _as_boolean(self, expr: _Expr) -> _Expr:
        if expr.is_boolean:
            return expr
        if expr.kind is _Kind.PROPERTY:
            return _Expr(_Kind.BOOLEAN, _boolean_cast(expr.name), expr.start, expr.end)
        raise _Invalid(
            f"{self._quote(expr)} is not a condition (it has no boolean value)", expr.start
        )

    def _logic(self, operator_name: str, left: _Expr, right: _Expr) -> _Expr:
        operands: tuple[Evaluator, ...] = ()
        for side in (self._as_boolean(left), self._as_boolean(right)):
            if side.logic is not None and side.logic[0] == operator_name:
                operands += side.logic[1]
            else:
                operands += (side.evaluate,)
        evaluate = _and(operands) if operator_name == "AND" else _or(operands)
        logic = (operator_name, operands)
        return _Expr(_Kind.BOOLEAN, evaluate, left.start, right.end, logic=logic)

    def _negate(self, operand: _Expr, start: int) -> _Expr:
        # UnaryExpression.createNegate: a number is negated, anything else becomes null.
        if operand.value is _UNKNOWN:
            return _Expr(_Kind.VALUE, _discard(operand.evaluate), start, operand.end)
        value = operand.value
        if type(value) in (int, float):
            value = -value
        elif type(value) is _Long:
            value = _Long(-value)
        else:
            value = None
        return _Expr(_Kind.VALUE, _constant(value), start, operand.end, value=value)

    def _check_orderable(self, expr: _Expr, symbol: str) -> None:
        # ComparisonExpression.checkLessThanOperand: only number literals, properties and
        # unary minus can be ordered.
        if expr.kind is _Kind.LITERAL and type(expr.value) in _NUMBER_TYPES:
            return
        if expr.kind is _Kind.LITERAL or expr.kind is _Kind.BOOLEAN:
            raise _Invalid(f"{self._quote(expr)} cannot be compared with {symbol}", expr.start)

    def _compare(self, symbol: str, left: _Expr, right: _Expr) -> _Expr:
        self._check_orderable(left, symbol)
        self._check_orderable(right, symbol)
        return self._boolean(_ordering(symbol, left, right), left.start)

    def _equal(self, left: _Expr, right: _Expr) -> _Expr:
        # checkEqualOperand and checkEqualOperandCompatability.
        for side in (left, right):
            if side.kind is _Kind.LITERAL and side.value is None:
                raise _Invalid(
                    "NULL cannot be compared with = or <>; use IS [NOT] NULL", side.start
                )
        literals = left.kind is _Kind.LITERAL and right.kind is _Kind.LITERAL
        if literals and left.is_boolean and not right.is_boolean:
            raise _Invalid(
                f"{self._quote(left)} cannot be compared with {self._quote(right)}", left.start
            )
        return self._boolean(_equality(left, right), left.start)

    def _between(self, value: _Expr, negated: bool) -> _Expr:
        low = self._unary_expression()
        self._expect("AND", "AND in BETWEEN")
        high = self._unary_expression()
        if negated:
            # createNotBetween: value < low OR value > high, with no check of the bounds.
            below, above = self._compare("<", value, low), self._compare(">", value, high)
            return self._logic("OR", below, above)
        if low.kind is _Kind.LITERAL and high.kind is _Kind.LITERAL:
            # createBetween checks literal bounds before the comparisons check their operands.
            bounds = f"BETWEEN {self._quote(low)} AND {self._quote(high)}"
            if low.value is None or high.value is None:
                raise _Invalid(f"{bounds}: the bounds cannot be NULL", low.start)
            try:
                order = _java_compare(high.value, low.value)
            except _EvaluationError:
                raise _Invalid(f"{bounds}: the bounds cannot be compared", low.start) from None
            if order < 0:
                raise _Invalid(f"{bounds}: the lower bound is above the upper bound", low.start)
        return self._logic("AND", self._compare(">=", value, low), self._compare("<=", value, high))

    def _in(self, value: _Expr, negated: bool) -> _Expr:
        if value.kind is not _Kind.PROPERTY:
            raise _Invalid(
                f"IN needs a property on its left, not {self._quote(value)}", value.start
            )
        values = self._string_list()
        return self._boolean(_in(value.name, values, negated), value.start)
