"""The sentence a customer reads for a decision: times in UTC HH:MM, amounts in USD."""

from __future__ import annotations

from datetime import datetime

import msgspec

from metering.money import describe_usd
from metering.policy.cap import CapBreach, CapKind
from metering.policy.duplicates import RuleHit
from metering.policy.ending import Ending, EndingRuling, Verdict
from metering.policy.facts import EventFact
from metering.policy.timeline import Timeline

_FAILURE_REASONS = {
    "network": "a network error",
    "server": "a server error",
    "provider": "a model provider error",
}
_NOT_BILLED = "nothing is billed until support resolves it."
_HELD = f"so the run is held for review; {_NOT_BILLED}"


class Amounts(msgspec.Struct, frozen=True):
    gross_micros: int
    billed_micros: int  # of the automatic decision, before any hold
    credited_micros: int


def usd(micros: int) -> str:
    return f"{describe_usd(micros)} USD"


def hhmm(moment: datetime) -> str:
    return moment.strftime("%H:%M")  # timeline times are already UTC


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _calls(count: int) -> str:
    return f"{count} model call{'' if count == 1 else 's'}"


def describe_interruption(event: EventFact) -> str:
    at = hhmm(event.time)
    if event.type == "connection.lost":
        return f"the connection dropped on our side at {at}"
    if event.type == "run.cancelled":
        return f"our system cancelled the run at {at}"
    reason = _FAILURE_REASONS.get(str(event.data.get("cause")), "a server-side error")
    return f"the run failed at {at} because of {reason}"


def _unverified(timeline: Timeline, ruling: EndingRuling) -> str:
    terminal, claim = timeline.terminal, ruling.client_evidence
    if terminal is not None:
        how = "with a cause reported by your app"
        if terminal.data.get("cause") != "client":
            how = "for an unknown reason"
        first = f"The run failed at {hhmm(terminal.time)} {how}"
    elif timeline.ended_at is not None:
        first = f"The run stopped reporting at {hhmm(timeline.ended_at)} without finishing"
    else:
        first = "The run stopped reporting without finishing"
    if claim is not None and claim.type == "connection.lost":
        return (
            f"{first}. Your app reported a lost connection at {hhmm(claim.time)}, "
            "but our systems saw no interruption."
        )
    return f"{first}, and our systems saw no interruption."


def _unprotected(interruption: EventFact) -> str:
    return (
        f"{_capitalised(describe_interruption(interruption))}; "
        "this platform's policy does not credit interrupted runs."
    )


def _opening(timeline: Timeline, ruling: EndingRuling) -> str:
    terminal = timeline.terminal
    if ruling.verdict is Verdict.HOLD or ruling.auto_refund_under_micros is not None:
        return _unverified(timeline, ruling)
    if ruling.unprotected is not None:
        return _unprotected(ruling.unprotected)
    if ruling.interruption is not None:
        what = _capitalised(describe_interruption(ruling.interruption))
        if ruling.delivery is None:
            return f"{what} and no result was delivered."
        return f"{what}; output up to step {ruling.delivery.data['step']} was delivered."
    assert terminal is not None  # abandoned runs are protected or held, never plain billed
    at = hhmm(terminal.time)
    if ruling.ending is Ending.COMPLETED:
        return f"The run completed at {at}."
    if ruling.ending is Ending.USER_CANCELLED:
        return f"The run was cancelled by the user at {at}."
    return f"The run failed at {at} because a tool failed, which usage protection does not cover."


def _credit_sentence(hit: RuleHit, count: int, micros: int) -> str:
    if hit.rule_id == "R1":
        what = "a tool call" if count == 1 else "tool calls"
        return (
            f"{_calls(count)} repeated {what} that had already completed; "
            f"{usd(micros)} was credited."
        )
    if hit.rule_id == "R2":
        when = "In the resumed attempt"
        if hit.anchor is not None:
            when = f"After the resume at {hhmm(hit.anchor.time)}"
        return f"{when}, {_calls(count)} only rebuilt context; {usd(micros)} was credited."
    assert hit.anchor is not None  # R3 always names its interruption
    since = "since the start of the run"
    if hit.checkpoint_step is not None:
        since = f"after the checkpoint at step {hit.checkpoint_step}"
    return (
        f"Work {since} was lost when {describe_interruption(hit.anchor)} and was redone "
        f"after the resume; the lost copy ({_calls(count)}, {usd(micros)}) was credited."
    )


def _credit_sentences(timeline: Timeline, hits: tuple[RuleHit, ...]) -> list[str]:
    # Each line is told once, under the first rule (R1, R2, R3) that named it.
    told: set[int] = set()
    sentences = []
    for hit in hits:
        fresh = hit.line_ids - told
        told |= fresh
        micros = sum(line.gross_micros for line in timeline.lines if line.line_id in fresh)
        if fresh:
            sentences.append(_credit_sentence(hit, len(fresh), micros))
    return sentences


def _breach_sentence(breach: CapBreach) -> str:
    if breach.kind is CapKind.AMOUNT:
        return (
            f"Crediting {usd(breach.credit_micros)} automatically would take this period's "
            f"automatic credits to {usd(breach.total_micros)}, above the "
            f"{usd(breach.limit_micros)} limit, {_HELD}"
        )
    return (
        f"Refunding it automatically would make {breach.refunded_runs} fully refunded runs "
        f"this period, above the limit of {breach.limit_runs}, {_HELD}"
    )


def _closing(amounts: Amounts, ruling: EndingRuling, breach: CapBreach | None) -> str:
    if amounts.gross_micros == 0:
        return "No usage was recorded, so nothing was charged."
    if breach is not None:
        return _breach_sentence(breach)
    if ruling.verdict is Verdict.HOLD:
        return f"Its {usd(amounts.gross_micros)} of usage is held for review; {_NOT_BILLED}"
    if amounts.credited_micros == 0:
        return f"All {usd(amounts.gross_micros)} of usage was billed."
    if amounts.billed_micros == 0:
        return f"The full {usd(amounts.gross_micros)} was credited."
    return f"{usd(amounts.billed_micros)} was billed and {usd(amounts.credited_micros)} credited."


def explain_parts(
    timeline: Timeline,
    hits: tuple[RuleHit, ...],
    ruling: EndingRuling,
    amounts: Amounts,
    breach: CapBreach | None,
) -> tuple[str, str]:
    """(story, closing): how the run ended and what R1–R3 credited, then the outcome in
    amounts. Kept apart so support's actions can replace the closing (:func:`after_support`)
    instead of contradicting it."""
    opening = _opening(timeline, ruling)
    refunded = ruling.verdict is Verdict.REFUND and breach is None
    if refunded and ruling.auto_refund_under_micros is not None:
        return (
            f"{opening} This platform refunds such runs under "
            f"{usd(ruling.auto_refund_under_micros)} without review; "
            f"the full {usd(amounts.gross_micros)} was restored.",
            "",
        )
    if refunded and amounts.gross_micros > 0:
        # Everything is restored, so the duplicate-work details would only add noise.
        return f"{opening[:-1]}; the full {usd(amounts.gross_micros)} was restored.", ""
    story = " ".join([opening, *_credit_sentences(timeline, hits)])
    return story, _closing(amounts, ruling, breach)


def explain(
    timeline: Timeline,
    hits: tuple[RuleHit, ...],
    ruling: EndingRuling,
    amounts: Amounts,
    breach: CapBreach | None,
) -> str:
    """Opening (how the run ended), what R1–R3 credited, then the outcome in amounts."""
    return " ".join(p for p in explain_parts(timeline, hits, ruling, amounts, breach) if p)


def after_support(
    story: str, amounts: Amounts, *, support_credit_micros: int, released: bool
) -> str:
    """The explanation once support has acted: the policy's story, what support did, and
    the amounts the run ends with — the one closing, so no sentence says "held" or "all
    billed" beside a release or a credit."""
    acts = []
    if released:
        acts.append("Support reviewed the run and released the hold")
    if support_credit_micros:
        acts.append(f"support credited {usd(support_credit_micros)}")
    did = _capitalised("; ".join(acts)) + "." if acts else ""
    if amounts.credited_micros == 0:
        result = f"All {usd(amounts.gross_micros)} of usage is billed."
    elif amounts.billed_micros == 0:
        result = f"The full {usd(amounts.gross_micros)} is credited."
    else:
        result = (
            f"In all, {usd(amounts.billed_micros)} is billed and "
            f"{usd(amounts.credited_micros)} credited."
        )
    return " ".join(p for p in (story, did, result) if p)
