"""Python entry points refuse values of the wrong Python type instead of truncating or
converting them (issue: robustness, item 5), and host-side cache bookkeeping refuses a
bad request whole (item 6)."""
import pytest
import torch

import specdec_ext
from specdec_ext import BlockManager, PagedKVCache
from specdec_ext._validate import check_int, valid_temperature


@pytest.mark.parametrize("value,exc", [(2.7, TypeError), (2.0, TypeError), (True, TypeError), ("3", TypeError),
                                       (None, TypeError), (torch.tensor(3), TypeError), (-1, ValueError)])
def test_check_int(value, exc):
    with pytest.raises(exc, match="n must be an int"):
        check_int("n", value, 0)


def test_check_int_accepts_ints_and_numpy_ints():
    import numpy as np

    assert check_int("n", 3, 0, 3) == 3 and check_int("n", np.int64(2)) == 2


@pytest.mark.parametrize("t,ok", [(0.0, True), (1e-38, True), (3e38, True), (1e-39, False), (1e-50, False),
                                  (-0.5, False), (float("nan"), False), (float("inf"), False), (1e39, False)])
def test_the_one_temperature_rule(t, ok):
    assert valid_temperature(t) == ok


def test_kv_rollback_wrapper_refuses_non_int_counts():
    lengths = torch.tensor([5, 5])
    with pytest.raises(TypeError, match="num_appended must be an int"):
        specdec_ext.kv_rollback_(lengths, 2.5, torch.tensor([1, 1]))
    with pytest.raises(TypeError, match="num_kept must be an int"):
        specdec_ext.kv_rollback_(lengths, 2, 1.5)
    assert lengths.tolist() == [5, 5]


def test_paged_kv_gather_wrapper_refuses_a_float_max_len():
    kc = torch.zeros(2, 4, 1, 8)
    with pytest.raises(TypeError, match="max_len must be an int"):
        specdec_ext.paged_kv_gather(kc, kc, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([3]), 2.7)
    with pytest.raises(TypeError, match="out must be a pair"):
        specdec_ext.paged_kv_gather(kc, kc, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([3]),
                                    out=torch.zeros(1, 1, 4, 8))


def test_block_manager_ref_count_range():
    bm = BlockManager(4, 2)
    with pytest.raises(ValueError, match="block must be an int in \\[0, 3\\]"):
        bm.ref_count(-1)
    with pytest.raises(TypeError, match="block must be an int"):
        bm.ref_count(1.0)
    assert bm.ref_count(0) == 0


def test_rollback_many_is_all_or_nothing():
    cache = PagedKVCache(1, 8, 2, 1, 4, torch.float32)
    cache.allocate(["x", "y"], 3)
    with pytest.raises(TypeError, match=r"num_kept\[1\] must be an int"):
        cache.rollback_many(["x", "y"], 2, [1, 1.5])
    assert cache.length("x") == 3 and cache.length("y") == 3  # x was not shrunk
    with pytest.raises(ValueError, match="sequence 'y'"):
        cache.rollback_many(["x", "y"], 2, [1, 3])
    assert cache.length("x") == 3
    cache.rollback_many(["x", "y"], 2, [1, 2])
    assert (cache.length("x"), cache.length("y")) == (2, 3)
