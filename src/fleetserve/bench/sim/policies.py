"""The policies: pull (one central queue) and push (routers in front of worker queues)."""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .engine import _DELIVER, _DONE, _PUBLISH, _PULL, Run, _Engine
from .params import Params
from .workload import Workload


class _Sim(_Engine):
    """One simulated run of one policy."""

    def run(self) -> Run:
        if self.policy == "pull":
            self._run_pull()
        else:
            self._run_push()
        return self._metrics()

    def _run_pull(self) -> None:
        central: deque[int] = deque()  # request ids; stays in arrival order (put-backs are older)
        idle: deque[int] = deque(range(len(self.speeds)))  # waiting pulls, served in turn
        items, tokens, rtt = self.wl.items, self.wl.tokens, self.p.rtt_ms
        arr, heap, n = self.arrivals, self.heap, len(self.arrivals)
        i = 0
        while i < n or heap:
            if i < n and (not heap or arr[i] <= heap[0][0]):
                t = arr[i]
                central.append(i)
                i += 1
                self._wake(idle, t)
                continue
            t, _, kind, w = heapq.heappop(heap)
            loc = self.local[w]
            if kind == _DONE:
                if central:
                    self._push(t + rtt, _PULL, w)
                elif loc:
                    self._batch(w, t)
                else:
                    self.busy[w] = False
                    idle.append(w)
                continue
            self.pulls += 1  # _PULL: oldest first, the worker's own unfinished requests
            # included, until the batch former's window is full; then put back the rest
            lim_n, lim_t = 2 * self.maxbs[w], 2 * self.budget[w]
            mine = sorted(loc, key=lambda ch: int(ch[0]))
            pulled: list[list[Any]] = []
            j = wn = wt = 0
            while wn < lim_n and wt < lim_t:
                if j < len(mine) and (not central or mine[j][0] < central[0]):
                    ch = mine[j]
                    j += 1
                elif central:
                    rid = central.popleft()
                    ch = [rid, items[rid], 0]
                    pulled.append(ch)
                    self.pending[w] += tokens[rid]
                else:
                    break
                seg = ch[1][ch[2] : ch[2] + lim_n - wn]
                wn += len(seg)
                wt += sum(seg)
            if not mine and not pulled:
                self.busy[w] = False
                idle.append(w)
                continue
            loc.clear()
            loc.extend(sorted(mine + pulled, key=lambda ch: int(ch[0])))
            self._batch(w, t)
            back = [ch for ch in pulled if ch[2] == 0]
            for ch in reversed(back):
                loc.remove(ch)
                self.pending[w] -= tokens[ch[0]]
                central.appendleft(ch[0])
                self._wake(idle, t)
            self.put_backs += len(back)

    def _wake(self, idle: deque[int], t: float) -> None:
        """Start the pull of the worker that has waited longest, if any is idle."""
        if idle:
            w = idle.popleft()
            self.busy[w] = True
            self._push(t + self.p.rtt_ms, _PULL, w)

    def _run_push(self) -> None:
        nw, nr, lag = len(self.speeds), self.p.routers, self.p.lag_ms
        items, tokens, hop = self.wl.items, self.wl.tokens, self.p.rtt_ms
        target = [0] * len(items)
        # what every router sees lag_ms late, and what each has done itself since then
        seen_n = np.zeros(nw, dtype=np.int64)
        seen_c = np.zeros(nw, dtype=np.float64)
        own_n = np.zeros((nr, nw), dtype=np.int64)
        own_c = np.zeros((nr, nw), dtype=np.float64)
        route = self._router(seen_n, seen_c, own_n, own_c)
        arr, heap, n = self.arrivals, self.heap, len(self.arrivals)
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
                if self.local[x]:
                    self._batch(x, t)
                else:
                    self.busy[x] = False
            elif kind == _DELIVER:
                w = target[x]
                self.local[w].append([x, items[x], 0])
                self.pending[w] += tokens[x]
                if not self.busy[w]:
                    self._batch(w, t)
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
