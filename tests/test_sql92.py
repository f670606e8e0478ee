"""The SQL92 filter against RocketMQ 4.9.x's SelectorParser and filter expressions.

Java files cited are under filter/src/main/java/org/apache/rocketmq/filter/ unless noted.
"""

import pytest
from shmq.broker.sql92 import FilterSyntaxError, Sql92Filter, compile_sql92


def matches(expression: str, **props: str) -> bool:
    return compile_sql92(expression).matches(props)


def check(cases: list[tuple[str, dict[str, str], bool]]) -> None:
    for expression, props, expected in cases:
        assert compile_sql92(expression).matches(props) is expected, (expression, props)


# --- operators -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, props, expected",
    [
        ("a = 'x'", {"a": "x"}, True),
        ("a = 'x'", {"a": "y"}, False),
        ("a <> 'x'", {"a": "y"}, True),
        ("a <> 'x'", {"a": "x"}, False),
        ("a > 5", {"a": "6"}, True),
        ("a > 5", {"a": "5"}, False),
        ("a >= 5", {"a": "5"}, True),
        ("a >= 5", {"a": "4"}, False),
        ("a < 5", {"a": "4"}, True),
        ("a < 5", {"a": "5"}, False),
        ("a <= 5", {"a": "5"}, True),
        ("a <= 5", {"a": "6"}, False),
        ("5 < a", {"a": "6"}, True),
        ("5 >= a", {"a": "6"}, False),
        ("a BETWEEN 2 AND 10", {"a": "2"}, True),
        ("a BETWEEN 2 AND 10", {"a": "10"}, True),
        ("a BETWEEN 2 AND 10", {"a": "1"}, False),
        ("a BETWEEN 2 AND 10", {"a": "11"}, False),
        ("a NOT BETWEEN 2 AND 10", {"a": "1"}, True),
        ("a NOT BETWEEN 2 AND 10", {"a": "11"}, True),
        ("a NOT BETWEEN 2 AND 10", {"a": "3"}, False),
        ("a NOT BETWEEN 10 AND 2", {"a": "5"}, True),  # only BETWEEN checks its bounds
        ("a IN ('3', '4', '5')", {"a": "4"}, True),
        ("a IN ('3', '4', '5')", {"a": "8"}, False),
        ("a IN ('1','2','3','4','5','6')", {"a": "6"}, True),
        ("a NOT IN ('3', '4')", {"a": "8"}, True),
        ("a NOT IN ('3', '4')", {"a": "3"}, False),
        ("a IS NULL", {"abc": "2"}, True),
        ("a IS NULL", {"a": ""}, False),
        ("a IS NOT NULL", {"a": ""}, True),
        ("a IS NOT NULL", {"abc": "2"}, False),
        ("a > -5", {"a": "-4"}, True),
        ("a < -5", {"a": "-4"}, False),
        ("a = - -5", {"a": "5"}, True),
        ("a = +5", {"a": "5"}, True),
        ("a = -1.5", {"a": "-1.5"}, True),
        ("NOT (a = 'x')", {"a": "y"}, True),
        ("NOT (a = 'x')", {"a": "x"}, False),
        ("NOT NOT (a = 'x')", {"a": "x"}, True),
        ("(a = '1' OR b = '1') AND c = '1'", {"b": "1", "c": "1"}, True),
        ("(a = '1' OR b = '1') AND c = '1'", {"a": "1"}, False),
        ("TAGS = 'tagA' AND KEYS IS NOT NULL", {"TAGS": "tagA", "KEYS": "k1"}, True),
    ],
)
def test_operators(expression: str, props: dict[str, str], expected: bool) -> None:
    assert compile_sql92(expression).matches(props) is expected


def test_between_is_both_bounds_inclusive_and_takes_the_first_and() -> None:
    expression = "a BETWEEN 1 AND 3 AND b = 'x'"
    assert matches(expression, a="2", b="x")
    assert not matches(expression, a="2", b="y")
    assert not matches(expression, a="4", b="x")


def test_bare_property_is_never_true_but_its_negation_is() -> None:
    # UnaryExpression.createBooleanCast: a String property is FALSE, a missing one NULL.
    assert not matches("a", a="true")
    assert matches("NOT a", a="anything")
    assert not matches("NOT a")
    assert not matches("a OR b", a="true", b="true")
    assert matches("a OR b = 'x'", a="true", b="x")


# --- literals ------------------------------------------------------------------------------


def test_string_literals_escape_quotes_by_doubling() -> None:
    assert matches("a = 'it''s'", a="it's")
    assert matches("a = ''", a="")
    assert matches("a = 'x\ny'", a="x\ny")
    assert matches("a = '--not a comment /* */'", a="--not a comment /* */")
    # ExpressionTest.testEvaluate_stringHasString
    assert matches("TAGS is not null and TAGS='''''tag'''''", TAGS="''tag''")


@pytest.mark.parametrize(
    "expression, value",
    [
        ("a = 10", "10"),
        ("a = 10L", "10"),
        ("a = 10l", "10"),
        ("a = 0", "0"),
        ("a = 1.5", "1.5"),
        ("a = 5.", "5"),
        ("a = .5", "0.5"),
        ("a = 5E2", "500"),
        ("a = 2.5e-1", "0.25"),
        ("a = 1.5E+1", "15"),
        ("a > 3.1E10", "3.1415E10"),  # ExpressionTest.testEvaluate_exponent
    ],
)
def test_number_literals(expression: str, value: str) -> None:
    assert matches(expression, a=value)


def test_boolean_and_null_literals() -> None:
    check(
        [
            ("TRUE", {}, True),
            ("FALSE", {}, False),
            ("NULL", {}, False),
            ("NOT FALSE", {}, True),
            ("NOT NULL", {}, False),
            ("TRUE AND NULL", {}, False),
            ("TRUE OR NULL", {}, True),
            ("NULL IS NULL", {}, True),
            ("5 IS NULL", {}, False),
            ("TRUE = TRUE", {}, True),
            ("TRUE <> FALSE", {}, True),
        ]
    )


def test_property_against_boolean_literal_uses_java_boolean_valueof() -> None:
    # ComparisonExpression.__compare: String vs Boolean -> Boolean.valueOf(String).
    check(
        [
            ("a = TRUE", {"a": "true"}, True),
            ("a = TRUE", {"a": "TRUE"}, True),
            ("a = TRUE", {"a": "yes"}, False),
            ("a = FALSE", {"a": "false"}, True),
            ("a = FALSE", {"a": "no"}, True),  # anything but "true" is false
            ("a=TRUE OR b=FALSE", {"a": "false", "b": "true"}, False),  # ExpressionTest
            # Boolean vs String casts the Boolean to String in Java: ClassCastException.
            ("TRUE = a", {"a": "true"}, False),
            ("(b = 'x') = a", {"a": "true", "b": "x"}, False),
        ]
    )


# --- precedence ----------------------------------------------------------------------------


def test_and_binds_tighter_than_or() -> None:
    expression = "a = '1' OR b = '1' AND c = '1'"
    assert matches(expression, a="1")
    assert not matches(expression, b="1")
    assert matches(expression, b="1", c="1")


def test_not_binds_tighter_than_comparisons() -> None:
    # SelectorParser.jj: NOT is parsed in unaryExpr, so `NOT a = 'x'` is `(NOT a) = 'x'`,
    # a Boolean compared with a String: it never matches.
    for props in ({"a": "y"}, {"a": "x"}, {}):
        assert not matches("NOT a = 'x'", **props)
    assert matches("NOT (a = 'x')", a="y")
    assert matches("NOT a = TRUE", a="y")  # (NOT a) is TRUE when a is present


def test_ordering_binds_tighter_than_equality() -> None:
    # equalityExpression is built from comparisonExpressions: `a > 1 = TRUE` is `(a > 1) = TRUE`.
    assert matches("a > 1 = TRUE", a="2")
    assert not matches("a > 1 = TRUE", a="0")
    assert matches("a IS NULL = TRUE")


# --- NULL and three-valued logic -----------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "a > 5",
        "NOT (a > 5)",
        "a = 'x'",
        "a <> 'x'",
        "NOT (a = 'x')",
        "a IN ('x')",
        "a NOT IN ('x')",
        "a BETWEEN 1 AND 2",
        "a NOT BETWEEN 1 AND 2",
        "a = TRUE",
        "a = 5 OR a <> 5",
    ],
)
def test_missing_property_never_matches(expression: str) -> None:
    assert not matches(expression, b="x")


def test_three_valued_logic() -> None:
    # LogicExpression: FALSE AND NULL = FALSE, TRUE OR NULL = TRUE, otherwise NULL.
    check(
        [
            ("a = '1' OR b = '1'", {"b": "1"}, True),
            ("a = '1' AND b = '1'", {"b": "1"}, False),
            ("NOT (a = '1' AND b = '2')", {"b": "3"}, True),
            ("NOT (a = '1' OR b = '2')", {"b": "3"}, False),
            ("a IS NULL OR a = 'hello'", {}, True),  # ExpressionTest.testEvaluate_nullOr
            ("a IS NULL OR a = 'hello'", {"a": "hello"}, True),
            ("a IS NULL OR a = 'hello'", {"a": "abc"}, False),
        ]
    )


def test_equality_with_null_is_asymmetric_as_in_java() -> None:
    # ComparisonExpression.doCreateEqual: null = x is NULL, x = null is FALSE, null = null TRUE.
    check(
        [
            ("a <> 'x'", {}, False),
            ("'x' <> a", {}, True),
            ("'x' = a", {}, False),
            ("a = b", {}, True),
            ("a = b", {"a": "1"}, False),
            ("a <> b", {"a": "1"}, True),
            ("a <> b", {"b": "1"}, False),
            ("a = b", {"a": "3.14", "b": "3.14"}, True),
            ("a <> b", {"a": "3.14", "b": "3.141"}, True),
        ]
    )


# --- strings and numbers -------------------------------------------------------------------


def test_property_against_int_literal_uses_integer_valueof() -> None:
    # ComparisonExpression.__compare: String vs Integer -> Integer.valueOf(String); a
    # NumberFormatException makes ExpressionMessageFilter answer "no match".
    check(
        [
            ("a > 5", {"a": "10"}, True),  # numerically, not "10" < "5"
            ("a = 5", {"a": "05"}, True),
            ("a = 5", {"a": "+5"}, True),
            ("a = 3", {"a": "\u0663"}, True),  # Java parses any Unicode decimal digit
            ("a = 5", {"a": " 5"}, False),
            ("a = 5", {"a": "5.0"}, False),
            ("a > 5", {"a": "5.5"}, False),
            ("a = 5", {"a": "abc"}, False),
            ("a <> 5", {"a": "abc"}, False),
            ("NOT (a = 5)", {"a": "abc"}, False),
            ("a = '5'", {"a": "05"}, False),  # a string literal compares as a string
        ]
    )


def test_literal_size_picks_integer_or_long() -> None:
    # ConstantExpression.createFromDecimal: an Integer when it fits, else a Long; the negation
    # of a Long stays a Long (UnaryExpression.negate).
    check(
        [
            ("a > 2147483647", {"a": "3000000000"}, False),
            ("a > 2147483648", {"a": "3000000000"}, True),
            ("a > -2147483647", {"a": "3000000000"}, False),
            ("a > -2147483648", {"a": "3000000000"}, True),
            ("a < 9223372036854775807", {"a": "9223372036854775806"}, True),
            ("a < 9223372036854775807", {"a": "9223372036854775808"}, False),
            ("a = 5", {"a": "0" * 5000 + "5"}, True),
            ("a = 5", {"a": "5" * 5000}, False),
        ]
    )


def test_property_against_float_literal_uses_double_valueof() -> None:
    check(
        [
            ("a > 5.0", {"a": "5.5"}, True),
            ("a > 3.14", {"a": "3.1415"}, True),  # ExpressionTest.testEvaluate_floatNumber
            ("a = 5.0", {"a": "5"}, True),
            ("a = 5.0", {"a": " 5\t"}, True),  # String.trim()
            ("a = 5.0", {"a": "5\u00a0"}, False),  # ... which only trims <= ' '
            ("a = 5.0", {"a": "5.0f"}, True),
            ("a = 5.0", {"a": "5D"}, True),
            ("a = 5.0", {"a": "0x1.4p2"}, True),
            ("a = 5.0", {"a": "1_5"}, False),
            ("a > 1.5", {"a": "Infinity"}, True),
            ("a < 1.5", {"a": "-Infinity"}, True),
            ("a > 1.5", {"a": "inf"}, False),
            # Double.compareTo puts NaN above every number.
            ("a > 1.5", {"a": "NaN"}, True),
            ("a < 1.5", {"a": "NaN"}, False),
            ("1.5 < a", {"a": "NaN"}, True),
            ("a = 1.5", {"a": "NaN"}, False),
        ]
    )


def test_two_properties_are_ordered_as_doubles() -> None:
    # ComparisonExpression.evaluate: two Strings under > >= < <= go through Double.valueOf.
    check(
        [
            ("a > b", {"a": "20", "b": "10"}, True),  # ExpressionTest.testEvaluate_twoVariableGt
            ("a > b", {"a": "10", "b": "9"}, True),
            ("a > b", {"a": "1.0", "b": "1"}, False),
            ("a >= b", {"a": "1.0", "b": "1"}, True),
            ("a = b", {"a": "1.0", "b": "1"}, False),  # = compares the strings
            ("a > b", {"a": "abc", "b": "1"}, False),
            ("a < b", {"a": "-0.0", "b": "0.0"}, True),  # Double.compare
            ("a = b", {"a": "NaN", "b": "NaN"}, True),
            ("a >= b", {"a": "NaN", "b": "NaN"}, True),
            ("a between up and low", {"a": "3.14", "up": "up", "low": "low"}, False),
        ]
    )


def test_literals_compare_across_java_types() -> None:
    check(
        [
            ("5 = 5.0", {}, True),
            ("'5' = 5", {}, True),
            ("'true' = TRUE", {}, True),
            ("1 = TRUE", {}, False),  # Integer vs Boolean: __compare answers -1
            ("2147483648 > 5", {}, True),
            ("-1.5 < 1", {}, True),
            # A long meeting a double is converted to double first, as in Java.
            ("9007199254740993 = 9007199254740992.0", {}, True),
        ]
    )


def test_an_evaluation_error_fails_the_whole_expression() -> None:
    # The exception propagates through OR; ExpressionMessageFilter catches it -> no match.
    assert not matches("a > 5 OR b = 'x'", a="abc", b="x")
    assert matches("b = 'x' OR a > 5", a="abc", b="x")  # short-circuits before the error
    assert not matches("a BETWEEN 0 AND 100", a="abc")
    assert not matches("key is not null and key between 0 and 100", key="con")


def test_unary_minus_of_a_non_number_is_null() -> None:
    assert not matches("a > -b", a="1", b="1")
    assert not matches("NOT (a > -b)", a="1", b="1")
    assert not matches("a = -'x'", a="y")  # x = null is FALSE ...
    assert matches("a <> -'x'", a="y")  # ... so its negation is TRUE
    assert matches("a = -'x'")  # and null = null is TRUE


# --- lexical -------------------------------------------------------------------------------


def test_comments() -> None:
    assert matches("a = '1' -- trailing comment", a="1")
    assert matches("a = '1' -- comment\nAND b = '2'", a="1", b="2")
    assert not matches("a = '1' -- comment\r\nAND b = '2'", a="1")
    assert matches("/* leading */ a /* inner ** / */ = '1'/**/", a="1")
    assert matches("a = '1' /* multi\nline */ AND b = '2'", a="1", b="2")


def test_keywords_are_case_insensitive_and_property_names_are_not() -> None:
    expression = "a = '1' and b between 1 And 3 oR c iS nOt NuLl aNd d In ('x') AND e Not In ('y')"
    assert matches(expression, a="1", b="2", d="x", e="z")
    assert matches("c is not null", c="")
    assert matches("a = true", a="TRUE")
    assert not matches("A = '1'", a="1")
    assert matches("A = '1'", A="1")


def test_identifiers() -> None:
    check(
        [
            ("$a_1 = '1'", {"$a_1": "1"}, True),
            ("_x = '1'", {"_x": "1"}, True),
            ("notes = '1'", {"notes": "1"}, True),  # a keyword prefix is still an identifier
            ("order_id IN ('7')", {"order_id": "7"}, True),
            ("isbn IS NOT NULL", {"isbn": "1"}, True),
            ("a <= now", {"a": "1", "now": "2"}, True),  # no NOW function in 4.x, a property
            ("UNIQ_KEY IS NOT NULL", {"UNIQ_KEY": "0A0B"}, True),
        ]
    )


def test_whitespace_forms() -> None:
    assert matches("a=3 and b<>4 And c>5 AND d<=4", a="3", b="5", c="6", d="1")
    assert matches("\ta\f=\r\n'1'\n", a="1")


# --- bad expressions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, problem, where",
    [
        ("", "found end of expression", "line 1, column 1"),
        ("   ", "found end of expression", "column 4"),
        ("-- just a comment", "found end of expression", "column 18"),
        ("(a = '1'", "expected ')' but found end of expression", "column 9"),
        ("((a = '1')", "expected ')'", "column 11"),
        ("a = '1')", "unexpected ')' after a complete expression", "column 8"),
        ("a == 1", "expected a value, a property or '(' but found '='", "column 4"),
        ("a != 1", "unexpected character '!'", "column 3"),
        ("a LIKE 'x%'", "unexpected 'LIKE' after a complete expression", "column 3"),
        ("a = 1 + 2", "unexpected '+'", "column 7"),
        ("a = 'x", "unterminated string literal", "column 5"),
        ("a = 'it''s", "unterminated string literal", "column 9"),  # 'it' is a whole literal
        ("a = '1' /* x", "unterminated /* comment", "column 9"),
        ("a = '1' b = '2'", "unexpected 'b' after a complete expression", "column 9"),
        ("a = '1' 'x'", "unexpected \"'x'\"", "column 9"),
        ("a = 007", "unexpected '0'", "column 6"),
        ("a = 1\nAND b ? 2", "unexpected character '?'", "line 2, column 7"),
        ("a = 1 AND", "found end of expression", "column 10"),
        ("a and between 2 and 10", "found 'between'", "column 7"),  # ParserTest
        ("a IS 1", "expected NULL or NOT NULL after IS but found '1'", "column 6"),
        ("a NOT 1", "expected BETWEEN or IN after NOT but found '1'", "column 7"),
        ("a BETWEEN 1 OR 2", "expected AND in BETWEEN but found 'OR'", "column 13"),
        ("a IN (1, 2)", "expected a string literal in the IN list but found '1'", "column 7"),
        ("a IN ()", "expected a string literal in the IN list", "column 7"),
        ("a IN 'x'", "expected '(' after IN", "column 6"),
        ("a IN ('x' 'y')", "expected ',' or ')' in the IN list", "column 11"),
        ("a.b = '1'", "unexpected character '.'", "column 2"),
        ("a = 0L", "unexpected 'L'", "column 6"),
    ],
)
def test_syntax_errors_say_what_and_where(expression: str, problem: str, where: str) -> None:
    with pytest.raises(FilterSyntaxError) as raised:
        compile_sql92(expression)
    message = str(raised.value)
    assert problem in message
    assert where in message


@pytest.mark.parametrize(
    "expression, problem",
    [
        # ComparisonExpression.checkLessThanOperand: only numbers and properties are ordered.
        ("a > 'x'", "`'x'` cannot be compared with >"),
        ("a > TRUE", "`TRUE` cannot be compared with >"),
        ("a < NULL", "`NULL` cannot be compared with <"),
        ("(a > 1) > 0", "`a > 1` cannot be compared with >"),
        ("NOT a > 1", "`NOT a` cannot be compared with >"),
        ("a BETWEEN 'a' AND 'b'", "`'a'` cannot be compared with >="),
        # checkEqualOperand / checkEqualOperandCompatability.
        ("a = NULL", "NULL cannot be compared with = or <>; use IS [NOT] NULL"),
        ("NULL <> a", "NULL cannot be compared"),
        ("TRUE = 1", "`TRUE` cannot be compared with `1`"),
        ("TRUE = 'x'", "`TRUE` cannot be compared with `'x'`"),
        # SelectorParser.asBooleanExpression.
        ("5", "`5` is not a condition"),
        ("'x'", "`'x'` is not a condition"),
        ("a = 1 AND 5", "`5` is not a condition"),
        ("NOT 'x'", "`'x'` is not a condition"),
        ("-a", "`-a` is not a condition"),
        # ComparisonExpression.createBetween checks literal bounds.
        ("a BETWEEN 10 AND 0", "BETWEEN `10` AND `0`: the lower bound is above the upper bound"),
        ("a BETWEEN NULL AND 1", "the bounds cannot be NULL"),
        ("a BETWEEN 1 AND 'x'", "the bounds cannot be compared"),
        # ComparisonExpression.createInFilter wants a property.
        ("NOT a IN ('x')", "IN needs a property on its left, not `NOT a`"),
        ("'a' IN ('a')", "IN needs a property on its left"),
        # ConstantExpression.createFromDecimal / createFloat.
        ("a > 100000000000000000000000", "integer 100000000000000000000000 is out of the Java long"),
        ("a > 9223372036854775808", "out of the Java long range"),
        ("a > " + "1" * 5000, "out of the Java long range"),
        # ParserTest.testParse_floatOverFlow
        ("a > " + "1" * 5000 + "." + "1" * 5000, "is outside"),
        ("a > 0.0", "float 0.0 is outside"),
        ("a > 1e-400", "float 1e-400 is outside"),
        ("a > 1e400", "float 1e400 is outside"),
    ],
)
def test_semantic_errors(expression: str, problem: str) -> None:
    location = "invalid SQL92 expression at line 1, column"
    with pytest.raises(FilterSyntaxError, match=location) as raised:
        compile_sql92(expression)
    assert problem in str(raised.value)


def test_filter_syntax_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        compile_sql92("a =")


def test_deep_nesting_is_a_syntax_error_and_long_chains_are_fine() -> None:
    assert matches("(" * 40 + "a = '1'" + ")" * 40, a="1")
    with pytest.raises(FilterSyntaxError, match="nested too deeply"):
        compile_sql92("(" * 5000 + "a = '1'" + ")" * 5000)
    chain = " OR ".join(f"a = '{i}'" for i in range(5000))
    assert matches(chain, a="4999")
    assert not matches(chain, a="x")
    conjunction = " AND ".join(f"a{i} IS NULL" for i in range(5000))
    assert matches(conjunction)
    assert not matches(conjunction, a4999="1")


# --- API -----------------------------------------------------------------------------------


def test_compiled_filters_are_cached_by_text() -> None:
    first = compile_sql92("a = 'cached'")
    assert isinstance(first, Sql92Filter)
    assert first.expression == "a = 'cached'"
    assert compile_sql92("a = 'cached'") is first
    assert compile_sql92("a = 'cached' ") is not first


def test_matches_returns_a_bool() -> None:
    sql_filter = compile_sql92("a = '1'")
    assert sql_filter.matches({"a": "1"}) is True
    assert sql_filter.matches({}) is False
    assert compile_sql92("a > 1").matches({"a": "x"}) is False
