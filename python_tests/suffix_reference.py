"""Brute-force reference of the suffix index (csrc/core/suffix_index.h): counts by scanning
every sequence, proposals by the same rules from those counts. Slow and obviously right."""
import heapq
import math


class RefSuffixIndex:
    def __init__(self, max_depth):
        self.max_depth = max_depth
        self.seqs = {}

    def add_sequence(self, sid):
        assert sid not in self.seqs
        self.seqs[sid] = []

    def append(self, sid, tokens):
        self.seqs[sid].extend(tokens)

    def remove(self, sid):
        del self.seqs[sid]

    def counts(self, pattern):
        """(occurrences, occurrences followed by a token); the empty pattern: (tokens, tokens)."""
        m = len(pattern)
        if m > self.max_depth:
            return 0, 0
        count = cont = 0
        for s in self.seqs.values():
            for i in range(len(s) - m + 1):
                if s[i:i + m] == list(pattern):
                    count += 1
                    cont += i + m < len(s) and m < self.max_depth
        return (cont, cont) if m == 0 else (count, cont)

    def distinct_substrings(self):
        out = set()
        for s in self.seqs.values():
            for i in range(len(s)):
                for j in range(i + 1, min(len(s), i + self.max_depth) + 1):
                    out.add(tuple(s[i:j]))
        return out

    def _children(self, pattern, prob, min_prob):
        """[(token, prob)] in (count desc, token asc) order, prob >= min_prob."""
        _, cont = self.counts(pattern)
        if cont == 0:
            return []
        tokens = {t for s in self.seqs.values() for t in s}
        kids = [(self.counts(list(pattern) + [t])[0], t) for t in tokens]
        kids = sorted([(c, t) for c, t in kids if c > 0], key=lambda ct: (-ct[0], ct[1]))
        return [(t, prob * c / cont) for c, t in kids if prob * c / cont >= min_prob]

    def _path(self, pattern, limit, min_prob):
        tokens, parents, probs, prob, pat = [], [], [], 1.0, list(pattern)
        for i in range(limit):
            kids = self._children(pat, prob, min_prob)
            if not kids:
                break
            t, prob = kids[0]
            tokens.append(t), parents.append(i - 1), probs.append(prob)
            pat.append(t)
        return tokens, parents, probs

    def _tree(self, pattern, limit, min_prob):
        heap, pushes = [], 0
        for t, q in self._children(pattern, 1.0, min_prob):
            heapq.heappush(heap, (-q, pushes, list(pattern) + [t], -1))
            pushes += 1
        tokens, parents, probs = [], [], []
        while heap and len(tokens) < limit:
            nq, _, pat, parent = heapq.heappop(heap)
            at = len(tokens)
            tokens.append(pat[-1]), parents.append(parent), probs.append(-nq)
            for t, q in self._children(pat, -nq, min_prob):
                heapq.heappush(heap, (-q, pushes, pat + [t], at))
                pushes += 1
        return tokens, parents, probs

    def propose(self, context, max_spec_tokens, factor=1.0, offset=0.0, min_prob=0.1, tree=False):
        best = ([], [], [], 0.0, 0)
        for m in range(1, min(len(context), self.max_depth) + 1):
            pat = list(context[len(context) - m:])
            count, cont = self.counts(pat)
            if count == 0 or cont == 0:
                break
            limit = min(max_spec_tokens, max(0, math.floor(factor * m + offset)))
            if limit == 0:
                continue
            tokens, parents, probs = (self._tree if tree else self._path)(pat, limit, min_prob)
            score = 0.0
            for p in probs:
                score += p
            if tokens and score >= best[3]:
                best = (tokens, parents, probs, score, m)
        return best
