"""The host tier: models asleep, within a budget of their own.

Under pressure the fleet first puts a model to sleep (``Member.sleep``): its weights
leave the process's memory (the memory budget) while a host-side copy stays, here a
mapped file the page cache holds, and a wake brings them back in milliseconds. The
sleeping models' weights are charged to this tier's budget instead. When a newcomer
does not fit, sleepers leave for good in the eviction policy's order, priced by what
their next load costs (a full load: ``Resident.reload_s`` is the seconds of the last
one), the newcomer too if it alone is larger than the budget.
"""

from __future__ import annotations

from .policy import Policy, Resident


class HostTier:
    """The sleeping models of one device, by id, and the bytes their copies hold."""

    def __init__(self, budget: int, policy: Policy) -> None:
        self.budget = budget
        self.policy = policy
        self._asleep: dict[str, Resident] = {}

    def __contains__(self, model: str) -> bool:
        return model in self._asleep

    def __len__(self) -> int:
        return len(self._asleep)

    @property
    def used(self) -> int:
        return sum(r.bytes for r in self._asleep.values())

    def add(self, record: Resident) -> list[str]:
        """``record``'s model is asleep now; the sleepers that must leave for good to
        keep the tier within its budget (``record``'s own model among them when it
        alone does not fit), already taken out of the tier."""
        self._asleep[record.model] = record
        out: list[str] = []
        if record.bytes > self.budget:
            out.append(record.model)
            del self._asleep[record.model]
        for r in self.policy.order(r for r in self._asleep.values() if r.model != record.model):
            if self.used <= self.budget:
                break
            out.append(r.model)
            del self._asleep[r.model]
        return out

    def remove(self, model: str) -> bool:
        """``model`` woke, or left for good: out of the tier (False: it was not in it)."""
        return self._asleep.pop(model, None) is not None


__all__ = ["HostTier"]
