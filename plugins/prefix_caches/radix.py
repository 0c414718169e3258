"""Radix-tree prefix caching over token ids at block granularity, as SGLang's RadixCache."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from schedlab.prefix_cache import PrefixCache, PrefixMatch


@dataclass(eq=False, slots=True)
class _Node:
    """A run of whole blocks; `tokens` holds exactly `len(blocks) * block_size` ids."""

    tokens: list[int]
    blocks: list[int]
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)  # by first block
    last_access: int = 0

    def up(self) -> _Node:
        """The parent of a node below the root (the root is never split nor evicted)."""
        assert self.parent is not None, "the root has no parent"
        return self.parent


class RadixPrefixCache(PrefixCache):
    """A radix tree whose edges are runs of whole blocks of token ids.

    A lookup walks down from the root comparing block by block; an insert extends the
    matched path with the request's own blocks, splitting a node where the tokens part ways.
    A node is locked while a request holds its blocks (reference count > 0, kept by the
    allocator); `evict` frees the tails of unlocked leaves, least recently used first, so a
    parent becomes a leaf and evictable only after its children went.

    NOTE: every holder of a node's block holds all of its ancestors' blocks too: an insert
    stops where the request's blocks differ from the cached ones for the same tokens (two
    requests that computed the same prefix at once), so the request's later blocks are not
    cached. Hence every unreferenced cached block can be evicted, leaves first.
    """

    def __init__(self, block_size: int, **options: object) -> None:
        super().__init__(block_size, **options)
        self._root = _Node([], [], None)
        self._node_of: dict[int, _Node] = {}  # block id -> the node holding it
        self._clock = itertools.count(1)  # logical time: deterministic LRU order

    def _key(self, tokens: Sequence[int], i: int) -> tuple[int, ...]:
        return tuple(tokens[i * self.block_size : (i + 1) * self.block_size])

    def _walk(self, token_ids: Sequence[int], num_blocks: int) -> Iterator[tuple[_Node, int, int]]:
        """(node, first query block at the node, blocks of the node that match), root down."""
        node, i = self._root, 0
        while i < num_blocks:
            child = node.children.get(self._key(token_ids, i))
            if child is None:
                return
            j = 1
            while j < len(child.blocks) and i + j < num_blocks and (
                self._key(child.tokens, j) == self._key(token_ids, i + j)
            ):
                j += 1
            yield child, i, j
            if j < len(child.blocks):
                return
            node, i = child, i + j

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        blocks: list[int] = []
        for node, _, j in self._walk(token_ids, len(token_ids) // self.block_size):
            blocks.extend(node.blocks[:j])
        return PrefixMatch(blocks, len(blocks) * self.block_size)

    def _touch(self, block_ids: Sequence[int]) -> None:
        now = next(self._clock)
        node_of = self._node_of
        last = None
        for b in block_ids:
            node = node_of.get(b)
            if node is not None and node is not last:
                node.last_access = now
                last = node

    def acquire(self, block_ids: Sequence[int]) -> None:
        self._touch(block_ids)

    def release(self, block_ids: Sequence[int]) -> None:
        self._touch(block_ids)

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
        bs, n = self.block_size, len(block_ids)
        now = next(self._clock)
        node, i = self._root, 0
        for child, start, j in self._walk(token_ids, n):
            child.last_access = now
            if child.blocks[:j] != list(block_ids[start : start + j]):
                return 0  # the same tokens are cached in other blocks; see the class NOTE
            i = start + j
            if j < len(child.blocks):
                if i == n:
                    return 0  # all of it is cached already
                node = self._split(child, j)
                break
            node = child
        if i == n or any(b in self._node_of for b in block_ids[i:]):
            return 0
        new_tokens, new_blocks = list(token_ids[i * bs : n * bs]), list(block_ids[i:])
        if node is not self._root and not node.children:
            node.tokens.extend(new_tokens)  # extend a leaf in place: the path stays compressed
            node.blocks.extend(new_blocks)
            leaf = node
        else:
            leaf = _Node(new_tokens, new_blocks, node, last_access=now)
            node.children[self._key(new_tokens, 0)] = leaf
        for b in new_blocks:
            self._node_of[b] = leaf
        return len(new_blocks)

    def _split(self, node: _Node, j: int) -> _Node:
        """Cut `node` after its j-th block; the upper part takes its place and is returned.
        Changes state."""
        bs = self.block_size
        parent = node.up()
        upper = _Node(node.tokens[: j * bs], node.blocks[:j], parent, last_access=node.last_access)
        parent.children[self._key(upper.tokens, 0)] = upper
        node.tokens, node.blocks, node.parent = node.tokens[j * bs :], node.blocks[j:], upper
        upper.children[self._key(node.tokens, 0)] = node
        for b in upper.blocks:
            self._node_of[b] = upper
        return upper

    def evict(self, num_blocks: int, is_unused: Callable[[int], bool]) -> list[int]:
        evicted: list[int] = []
        seq = itertools.count()
        heap = [(n.last_access, next(seq), n) for n in self._leaves() if is_unused(n.blocks[-1])]
        heapq.heapify(heap)
        while heap and len(evicted) < num_blocks:
            _, _, node = heapq.heappop(heap)
            while node.blocks and len(evicted) < num_blocks and is_unused(node.blocks[-1]):
                b = node.blocks.pop()
                del node.tokens[-self.block_size :]
                del self._node_of[b]
                evicted.append(b)
            if node.blocks:
                continue
            parent = node.up()
            del parent.children[next(k for k, c in parent.children.items() if c is node)]
            if parent is not self._root and not parent.children and is_unused(parent.blocks[-1]):
                heapq.heappush(heap, (parent.last_access, next(seq), parent))
        return evicted

    def _leaves(self) -> Iterator[_Node]:
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                yield node

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._node_of

    def num_cached_blocks(self) -> int:
        return len(self._node_of)

    def check_integrity(self) -> None:
        bs = self.block_size
        seen = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                assert child.parent is node, "a child's parent pointer is stale"
                assert child.blocks, "an empty node stayed in the tree"
                assert len(child.tokens) == len(child.blocks) * bs, "tokens and blocks disagree"
                assert key == tuple(child.tokens[:bs]), "a child is filed under the wrong key"
                for b in child.blocks:
                    assert self._node_of.get(b) is child, f"block {b} index is stale"
                seen += len(child.blocks)
                stack.append(child)
        assert seen == len(self._node_of), "the block index holds blocks outside the tree"
