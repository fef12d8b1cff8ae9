"""A deterministic network of federation routers (seed 000 §3.7) for tests and the sweep.

Links behave like the gRPC streams of ``broker.adapters.federation``: FIFO, a link opens when a
``LinkRequest`` is sent, closing it (``Unlink``) or a crash tells the other end (``link_lost``)
after whatever was already queued. Every ``Deliver`` is recorded per router, every message sent
per kind, so checks can compare the routers with a brute-force oracle.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from broker.federation.messages import (
    Action,
    Deliver,
    Event,
    LinkMessage,
    LinkRequest,
    Note,
    Retained,
    Send,
    StoreRetained,
    Unlink,
)
from broker.federation.router import FederationRouter, PlaceSettings
from broker.federation.store_port import CustodyStore

_LOST = "lost"


@dataclass
class FederationNet:
    """Routers by name and the FIFO of messages between them; ``now`` advances by ``tick``."""

    settings: PlaceSettings
    routers: dict[str, FederationRouter] = field(default_factory=dict)
    now: float = 0.0
    delivered: dict[str, list[Event]] = field(default_factory=dict)
    sent: Counter[str] = field(default_factory=Counter)
    notes: list[tuple[str, Note]] = field(default_factory=list)
    stored: dict[str, dict[str, Retained]] = field(default_factory=dict)  # StoreRetained, per router
    _links: set[frozenset[str]] = field(default_factory=set)
    _queue: deque[tuple[str, str, LinkMessage | str]] = field(default_factory=deque)

    def add(
        self, name: str, settings: PlaceSettings | None = None, *, store: CustodyStore | None = None
    ) -> FederationRouter:
        """A router named ``name``; ``store`` keeps its custody across a ``crash`` and a new
        ``add`` of the same name (then call ``restore``)."""
        router = FederationRouter(name, settings or self.settings, store=store)
        self.routers[name] = router
        self.delivered[name] = []
        return router

    def apply(self, source: str, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                if isinstance(action.message, LinkRequest):
                    if action.peer not in self.routers:
                        self._queue.append((action.peer, source, _LOST))
                        continue
                    self._links.add(frozenset((source, action.peer)))
                if frozenset((source, action.peer)) in self._links:
                    self.sent[type(action.message).__name__] += 1
                    self._queue.append((source, action.peer, action.message))
            elif isinstance(action, Deliver):
                self.delivered[source].append(action.event)
            elif isinstance(action, StoreRetained):
                self.stored.setdefault(source, {})[action.write.topic] = action.write
            elif isinstance(action, Unlink):
                pair = frozenset((source, action.peer))
                if pair in self._links:
                    self._links.discard(pair)
                    self._queue.append((source, action.peer, _LOST))
            else:
                self.notes.append((source, action))

    def run(self, max_steps: int = 1_000_000) -> int:
        """Deliver queued messages until none is left; the number delivered."""
        steps = self.step(max_steps)
        assert not self._queue, "the federation did not settle"
        return steps

    def step(self, count: int) -> int:
        """Deliver at most ``count`` queued messages (an event half-way through the tree)."""
        steps = 0
        while self._queue and steps < count:
            source, target, message = self._queue.popleft()
            steps += 1
            router = self.routers.get(target)
            if router is None:
                continue
            if message == _LOST:
                self.apply(target, router.link_lost(source, self.now))
            elif isinstance(message, str):
                continue
            else:
                self.apply(target, router.on_message(source, message, self.now))
        return steps

    def do(self, name: str, actions: list[Action]) -> None:
        self.apply(name, actions)
        self.run()

    def tick(self, seconds: float) -> None:
        self.now += seconds
        for name in sorted(self.routers):
            self.apply(name, self.routers[name].tick(self.now))
        self.run()

    def crash(self, name: str, *, settle: bool = True, drop_outgoing: bool = False) -> None:
        """Kill ``name``: its links break (the other ends see ``link_lost`` after what is queued);
        messages queued to it are lost; with ``drop_outgoing`` so are those it sent that are
        still queued (frames a kill -9 leaves unwritten)."""
        del self.routers[name]
        if drop_outgoing:
            self._queue = deque(item for item in self._queue if item[0] != name)
        for pair in [pair for pair in self._links if name in pair]:
            self._links.discard(pair)
            (other,) = pair - {name}
            self._queue.append((name, other, _LOST))
        if settle:
            self.run()

    def build_tree(self, parents: dict[str, str]) -> None:
        """Link every router to its parent (children named after their parents are linked later)."""
        for child, parent in parents.items():
            self.do(child, self.routers[child].set_upstream(parent, self.now))
