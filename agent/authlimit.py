"""Wrong tokens per client address: a throttle against guessing the API token.

The API's bearer check and the console's sign-in share one `AuthFailures`. Each wrong token a
client address sends is noted; once an address has sent `limit` wrong tokens within `window_s`, every
further token check from it is refused with 429 (and `Retry-After`) until its oldest failure leaves
the window, whether the token it sends then is right or not. A right token never clears failures.

Bounded: addresses whose newest failure is older than the window are dropped as others arrive, and
at most `max_clients` addresses are kept (the least recently failing go first). The number held is
the gauge `trainmedic_state_entries{kind="auth_failures"}`.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable


class AuthFailures:
    def __init__(
        self,
        *,
        limit: int = 10,
        window_s: float = 60.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_clients = max_clients
        self.clock = clock
        # address -> times of its recent failures (newest last); ordered by the newest failure.
        self._by_client: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_client)

    def _expire(self, now: float) -> None:
        while self._by_client:
            _, times = next(iter(self._by_client.items()))
            if times and times[-1] > now - self.window_s:
                break
            self._by_client.popitem(last=False)

    def retry_after(self, client: str) -> float | None:
        """Seconds until `client` may try a token again; None when it may now."""
        now = self.clock()
        self._expire(now)
        times = self._by_client.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) < self.limit:
            return None
        return max(0.0, times[0] + self.window_s - now)

    def failed(self, client: str) -> None:
        """Note one wrong token from `client`."""
        now = self.clock()
        self._expire(now)
        times = self._by_client.pop(client, None)
        if times is None:
            times = deque(maxlen=self.limit)
        times.append(now)
        self._by_client[client] = times
        while len(self._by_client) > self.max_clients:
            self._by_client.popitem(last=False)


def client_address(scope_client: object) -> str:
    """The peer address of an ASGI scope's `client` (host, port), or "unknown"."""
    if isinstance(scope_client, tuple | list) and scope_client:
        return str(scope_client[0])
    return "unknown"
