"""The policies: pull (one central queue) and push (routers in front of worker queues)."""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from .engine import _DELIVER, _DONE, _EXPIRE, _PUBLISH, _PULL, Run, _Engine
from .params import Params
from .puller import Lanes, Msg, Puller
from .synthetic import Workload

FULL_POLL_MS = 20.0  # worker/loop.py FULL_POLL: a full worker's pull for queries lasts this


class _Sim(_Engine):
    """One simulated run of one policy."""

    def run(self) -> Run:
        if self.policy == "pull":
            self._run_pull()
        else:
            self._run_push()
        return self._metrics()

    # -- pull ---------------------------------------------------------------------
    def _run_pull(self) -> None:
        p, nw = self.p, len(self.speeds)
        self.lanes = Lanes()
        self.pullers = [Puller(b, p.age_limit_ms) for b in self.budget]
        self.waiting: deque[int] = deque()  # long-polling workers, served in turn
        self.pulling = [False] * nw  # a pull is on its way, or long-polls
        self.only = [False] * nw  # that pull is for interactive work only (full)
        self.gen = [0] * nw  # which long-poll an expiry is for
        self.high = [round(p.high_water * b) for b in self.budget]  # pull below this
        self.ask = [round(max(p.high_water, 1.0) * b) for b in self.budget]  # room up to this
        self.room = [0] * nw  # what each worker asked for
        for w in range(nw):
            self._want(w, 0.0)
        items, inter, formers = self.wl.items, self.interactive, self.formers
        arr, heap, n = self.arrivals, self.heap, len(self.arrivals)
        i = 0
        while i < n or heap:
            if i < n and (not heap or arr[i] <= heap[0][0]):
                t = arr[i]
                m = Msg(i, items[i], t, inter[i])
                self.lanes.publish(m)
                i += 1
                self._wake([m], t)
                continue
            t, _, kind, w = heapq.heappop(heap)
            if kind == _DONE:
                self.busy[w] = False
                if formers[w]:
                    self._start(w, t)
                self._want(w, t)
            elif kind == _EXPIRE:  # a full worker's interactive-only pull ends
                w, g = w % nw, w // nw
                if g == self.gen[w] and self.pulling[w] and w in self.waiting:
                    self.waiting.remove(w)
                    self.pulling[w] = False
                    self._want(w, t)
            else:  # _PULL
                self._pulled(w, t)

    def _pulled(self, w: int, t: float) -> None:
        self.pulls += 1
        got = self.pullers[w].pull(self.lanes, t, self.room[w], self.only[w])
        if not got.kept:  # others took it first: wait on
            self._wait(w, t, first=True)
            return
        self.pulling[w] = False
        for m in got.kept:
            self.formers[w].add(m, t)
        if self.t0 <= t <= self.t1:
            self.put_backs += len(got.put_back)
            self.parts += len(got.parts)
        self._wake(got.put_back + got.parts, t)
        if not self.busy[w]:
            self._start(w, t)
        self._want(w, t)

    def _want(self, w: int, t: float) -> None:
        """Worker ``w``'s next pull, as ``worker/loop.py`` makes it: for the room below its
        high water (two budgets) or, when it is full, for interactive work only, up to one
        budget of it waiting here, polled every ``FULL_POLL_MS``."""
        if self.pulling[w]:
            return
        f = self.formers[w]
        if f.pending == 0 or f.pending < self.high[w]:
            room, only = self.ask[w] - f.pending, False
        else:
            room, only = self.budget[w] - f.hi_pending, True
            if room <= 0 or not self.p.full_pull:
                return  # it waits for room: the next batch calls again
        self.pulling[w], self.room[w], self.only[w] = True, room, only
        if self.lanes.hi or (self.lanes.lo and not only):
            self._push(t + self.p.rtt_ms, _PULL, w)
            return
        self._wait(w, t)

    def _wait(self, w: int, t: float, first: bool = False) -> None:
        """Worker ``w``'s pull long-polls; a full worker's ends after ``FULL_POLL_MS``."""
        if first:
            self.waiting.appendleft(w)
        else:
            self.waiting.append(w)
        if self.only[w]:
            self.gen[w] += 1
            self._push(t + FULL_POLL_MS, _EXPIRE, self.gen[w] * len(self.speeds) + w)

    def _wake(self, msgs: list[Msg], t: float) -> None:
        """Messages arrived: as many long-polling workers that take them pull, longest
        waiting first (a full worker's pull takes interactive work only)."""
        for m in msgs:
            if not self.waiting:
                return
            if m.interactive:
                w = self.waiting.popleft()
            else:
                w = next((x for x in self.waiting if not self.only[x]), -1)
                if w < 0:
                    continue
                self.waiting.remove(w)
            self._push(t + self.p.rtt_ms, _PULL, w)

    # -- push ---------------------------------------------------------------------
    def _run_push(self) -> None:
        nw, nr, lag = len(self.speeds), self.p.routers, self.p.lag_ms
        items, tokens, hop, inter = self.wl.items, self.wl.tokens, self.p.rtt_ms, self.interactive
        target = [0] * len(items)
        # what every router sees lag_ms late, and what each has done itself since then
        seen_n = np.zeros(nw, dtype=np.int64)
        seen_c = np.zeros(nw, dtype=np.float64)
        own_n = np.zeros((nr, nw), dtype=np.int64)
        own_c = np.zeros((nr, nw), dtype=np.float64)
        route = self._router(seen_n, seen_c, own_n, own_c)
        arr, heap, n, formers = self.arrivals, self.heap, len(self.arrivals), self.formers
        i = 0
        while i < n or heap:
            if i < n and (not heap or arr[i] <= heap[0][0]):
                r = i % nr
                w = route(i, r)
                target[i] = w
                own_n[r, w] += 1
                own_c[r, w] += tokens[i]
                self._push(arr[i] + hop, _DELIVER, i)
                self._push(arr[i] + lag, _PUBLISH, i)
                i += 1
                continue
            t, _, kind, x = heapq.heappop(heap)
            if kind == _DONE:
                self.busy[x] = False
                if formers[x]:
                    self._start(x, t)
            elif kind == _DELIVER:
                w = target[x]
                formers[w].add(Msg(x, items[x], arr[x], inter[x]), t)
                if not self.busy[w]:
                    self._start(w, t)
            elif kind == _PUBLISH:  # the assignment reaches everyone's view
                w, r = target[x], x % nr
                own_n[r, w] -= 1
                own_c[r, w] -= tokens[x]
                seen_n[w] += 1
                seen_c[w] += tokens[x]
            else:  # _SEEN: the completion reaches everyone's view
                w = target[x]
                seen_n[w] -= 1
                seen_c[w] -= tokens[x]

    def _router(
        self,
        seen_n: npt.NDArray[np.int64],
        seen_c: npt.NDArray[np.float64],
        own_n: npt.NDArray[np.int64],
        own_c: npt.NDArray[np.float64],
    ) -> Callable[[int, int], int]:
        nw, tokens = len(self.speeds), self.wl.tokens
        inv = np.asarray(self.inv, dtype=np.float64)
        rng = random.Random(len(tokens) * 7919 + nw)
        if self.policy == "push-rr":
            return lambda i, r: i % nw
        if self.policy == "push-lor":

            def lor(i: int, r: int) -> int:
                view = seen_n + own_n[r]
                ties = np.flatnonzero(view == view.min())
                return int(ties[rng.randrange(len(ties))] if len(ties) > 1 else ties[0])

            return lor
        return lambda i, r: int(np.argmin((seen_c + own_c[r] + tokens[i]) * inv))


def simulate(
    wl: Workload, speeds: Sequence[float], rate_rps: float, policy: str, params: Params
) -> Run:
    """One run: ``policy`` serves ``wl`` at ``rate_rps`` on workers of the given speeds."""
    return _Sim(wl, speeds, rate_rps, policy, params).run()
