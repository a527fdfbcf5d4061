"""Pure: which rule credited each line of a decision.

A decision stores the lines it credited and the rules that fired, not which rule named
which line. The rules are pure functions of the run's facts, so the policy's own rule
functions, run again over the same facts, say which lines each one names. A line two
rules name is given to the first in rule order: R1–R3 credit a line whatever the ending,
so R4/R5 (which credit on the way the run ended) cost only what R1–R3 had not already
credited.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from metering.policy import RunFacts
from metering.policy.duplicates import line_rules
from metering.policy.ending import Verdict, rule_on_ending
from metering.policy.timeline import build_timeline
from metering.protection.report import RULES, UNATTRIBUTED

ENDING_RULE = {Verdict.REFUND: "R4", Verdict.PARTIAL: "R5"}


def crediting_rules(rule_ids: Iterable[str]) -> list[str]:
    """The decision's rules that credit lines (R1–R5), in rule order."""
    fired = set(rule_ids)
    return [rule for rule in RULES if rule in fired]


def lines_named_by_rule(facts: RunFacts) -> dict[str, frozenset[int]]:
    """The lines each of R1–R5 names, from the policy's rule functions."""
    timeline = build_timeline(facts)
    named = {hit.rule_id: hit.line_ids for hit in line_rules(timeline)}
    ruling = rule_on_ending(timeline)
    if ruling.verdict in ENDING_RULE:
        named[ENDING_RULE[ruling.verdict]] = ruling.line_ids
    return named


def attribute_lines(
    credited_line_ids: Collection[int],
    rule_ids: Iterable[str],
    facts: Callable[[], RunFacts],
) -> dict[int, str]:
    """Each credited line → the rule that credited it.

    ``facts`` is called only when the decision names more than one crediting rule (with
    one, every credited line is that rule's), so most runs need no events loaded.
    """
    if not credited_line_ids:
        return {}
    rules = crediting_rules(rule_ids)
    if len(rules) == 1:
        return dict.fromkeys(credited_line_ids, rules[0])
    named = lines_named_by_rule(facts()) if rules else {}
    attributed: dict[int, str] = {}
    for line_id in credited_line_ids:
        rule = next((r for r in rules if line_id in named.get(r, ())), UNATTRIBUTED)
        attributed[line_id] = rule
    return attributed
