"""n-hop discovery of re-link targets with hop attributes (seed 000 §3.7.3 (4), Fig. 18).

Every router, once linked and then every ``probe_interval_s``, sends two discovery events to its
parent: one with hop attribute UPSTREAM and ``n = probe_hops`` (it climbs the tree: the
ancestors answer with their distance - the re-link targets after the parent's crash, nearest
first) and one with hop attribute ALL and ``n = 2`` (the parent passes it to its other links:
the grandparent and the *siblings* answer). When the root itself crashes its children have no
ancestor left; they all knew the same siblings, so each picks the smallest name among them and
itself: that one becomes the new root, the others request their link to it (and, failing that,
to the next). The replies retrace the discovery event's trail; ``Discovery`` keeps what the
latest round found, on top of what the round before found: a round's answers arrive one by one
(the parent's first, the grandparent's through it), so a crash of the parent half-way through a
round must not leave its child knowing only the parent - it would take the grandparent for a
sibling and elect a root. An ancestor that stops answering is forgotten one round later.
"""

from __future__ import annotations

from broker.federation.messages import HopAttribute, Probe, ProbeReply

SIBLING_HOPS = 2


class Discovery:
    """What one router's discovery rounds found."""

    def __init__(self) -> None:
        self.round = 0
        self.next_at = 0.0
        self._upstream = _Rounds()  # ancestor -> hops (UPSTREAM rounds)
        self._nearby = _Rounds()  # grandparent and siblings at 2 hops (ALL rounds)

    @property
    def upstream(self) -> dict[str, int]:
        """Ancestor -> hops, as the latest round and the one before found them."""
        return self._upstream.view()

    def probes(self, name: str, now: float, interval_s: float, hops: int) -> list[Probe]:
        """The discovery events to send to the parent now."""
        self.next_at = now + interval_s
        if hops < 1:
            return []
        self.round += 1
        return [
            Probe(self.round, hops, HopAttribute.UPSTREAM, (name,)),
            Probe(self.round, SIBLING_HOPS, HopAttribute.ALL, (name,)),
        ]

    def learned(self, reply: ProbeReply) -> None:
        """A reply reached this router, the prober."""
        rounds = self._upstream if reply.attribute is HopAttribute.UPSTREAM else self._nearby
        rounds.answer(reply.round, reply.responder, reply.hop)

    def siblings(self) -> set[str]:
        nearby = self._nearby.view()
        return {name for name, hop in nearby.items() if hop == SIBLING_HOPS} - set(self.upstream)

    def candidates(self, exclude: str) -> list[str]:
        """The ancestors to re-link to, nearest first."""
        known = sorted(self.upstream.items(), key=lambda item: (item[1], item[0]))
        return [name for name, _hop in known if name != exclude]

    def election(self, name: str) -> list[str]:
        """After the root's crash: the siblings to request a link to, the elected one first;
        [] when this router is the elected one (the new root)."""
        siblings = sorted(self.siblings())
        if not siblings or name < siblings[0]:
            return []
        return siblings

    def forget(self) -> None:
        self._upstream, self._nearby = _Rounds(), _Rounds()


class _Rounds:
    """The answers to the latest discovery round of one hop attribute and to the round before."""

    def __init__(self) -> None:
        self.round = 0
        self.latest: dict[str, int] = {}
        self.before: dict[str, int] = {}

    def answer(self, round_: int, responder: str, hop: int) -> None:
        if round_ < self.round:
            return  # a late answer to an older round
        if round_ > self.round:
            self.round, self.before, self.latest = round_, self.latest, {}
        self.latest[responder] = hop

    def view(self) -> dict[str, int]:
        return {**self.before, **self.latest}
