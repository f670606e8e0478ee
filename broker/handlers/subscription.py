"""A consumer's subscription as the pull handler filters by it: TAG codes or
a compiled SQL92 expression (FilterAPI.buildSubscriptionData)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from shmq.core.consumequeue import ALL_TAGS
from shmq.core.layout import java_string_hash
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import BadRequest

from ..sql92 import FilterSyntaxError, Sql92Filter, compile_sql92


@dataclass
class Subscription:
    topic: str
    sub_string: str
    codes: np.ndarray          # sorted tag codes; empty = every message
    version: int
    expression_type: str
    sql: Sql92Filter | None = None
    error: BadRequest | None = None    # a registered expression the broker cannot use


def parse_subscription(topic: str, sub: str | None, expression_type: str | None = None,
                       version: int = 0, sql_enabled: bool = False) -> Subscription:
    """FilterAPI.buildSubscriptionData: TAG expressions ('*'/empty = all, else
    tags split on '||'; codes are Java String.hashCode of each tag) or SQL92
    expressions over the message properties (enablePropertyFilter)."""
    etype = (expression_type or "TAG").upper()
    s = (sub or "").strip()
    if etype == "SQL92":
        if not sql_enabled:
            raise BadRequest(R.SYSTEM_ERROR, "The broker does not support consumer to filter "
                                             "message by SQL92")
        try:
            return Subscription(topic, s, ALL_TAGS, version, etype, compile_sql92(s))
        except FilterSyntaxError as e:
            raise BadRequest(R.SUBSCRIPTION_PARSE_FAILED,
                             f"parse the consumer's subscription[{sub}] failed: {e}") from None
    if etype != "TAG":
        raise BadRequest(R.SYSTEM_ERROR, "The broker does not support consumer to filter "
                                         "message by " + etype)
    if not s or s == "*":
        return Subscription(topic, "*", ALL_TAGS, version, etype)
    tags = [t.strip() for t in s.split("||") if t.strip()]
    if not tags:
        raise BadRequest(R.SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription[{sub}] failed")
    codes = np.array(sorted({java_string_hash(t) for t in tags}), dtype=np.int64)
    return Subscription(topic, s, codes, version, etype)
