"""Subscriptions: the topic tries of every session's filters (MQTT §4.7, shared §4.8.2).

One insertion path (:meth:`Subscriptions.add`) and one removal path (:meth:`Subscriptions.remove`)
for every caller - SUBSCRIBE, a session restored from the store, a session imported from another
broker - each keeping the session's own table, the trie (or the shared trie for ``$share/g/f``)
and the cluster's interest counters (``ClusterPort.on_subscribe``) in step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker.core.session import Session, SubOptions
from broker.mqtt.topics import SubscriptionTrie

if TYPE_CHECKING:
    from broker.core.ports import ClusterPort


class Subscriptions:
    """Every local subscription, indexed for matching."""

    __slots__ = ("_cluster", "shared_trie", "trie")

    def __init__(self, cluster: ClusterPort) -> None:
        self._cluster = cluster
        self.trie: SubscriptionTrie[str, SubOptions] = SubscriptionTrie()
        self.shared_trie: SubscriptionTrie[tuple[str, str], SubOptions] = SubscriptionTrie()

    def __len__(self) -> int:
        return len(self.trie) + len(self.shared_trie)

    def add(self, session: Session, opts: SubOptions) -> bool:
        """Add (or replace) one subscription of ``session``; True if it replaced one."""
        existed = opts.topic_filter in session.subscriptions
        session.subscriptions[opts.topic_filter] = opts
        client_id = session.client_id
        if opts.share_group is not None:
            self.shared_trie.add(opts.match_filter, (opts.share_group, client_id), opts)
        else:
            self.trie.add(opts.match_filter, client_id, opts)
        self._cluster.on_subscribe(client_id, opts.match_filter, opts.share_group, opts.qos)
        return existed

    def add_all(self, session: Session, subscriptions: Iterable[SubOptions]) -> None:
        for opts in subscriptions:
            self.add(session, opts)

    def remove(self, session: Session, topic_filter: str) -> SubOptions | None:
        """Remove the subscription of ``session`` to ``topic_filter`` (full filter, with any
        $share prefix); the removed options, or None if there was none."""
        opts = session.subscriptions.pop(topic_filter, None)
        if opts is None:
            return None
        client_id = session.client_id
        if opts.share_group is not None:
            self.shared_trie.remove(opts.match_filter, (opts.share_group, client_id))
        else:
            self.trie.remove(opts.match_filter, client_id)
        self._cluster.on_unsubscribe(client_id, opts.match_filter, opts.share_group)
        return opts

    def remove_all(self, session: Session) -> None:
        for topic_filter in list(session.subscriptions):
            self.remove(session, topic_filter)

    def share_group_members(self, topic: str, group: str, match_filter: str) -> list[tuple[str, SubOptions]]:
        """The (client id, options) of share group (group, filter) whose filter matches ``topic``."""
        return [
            (client_id, opts)
            for flt, (member_group, client_id), opts in self.shared_trie.match(topic)
            if member_group == group and flt == match_filter
        ]
