import pytest

from retrykit import backoff, jitter


def test_cap():
    assert backoff(20) == 30.0


def test_grows():
    assert backoff(3) > backoff(2)


# Planted flaky tests (for `gagar validate`): jitter is random, and this bound holds only half the time.
@pytest.mark.parametrize("seed", range(8))
def test_jitter_stays_small(seed):
    assert jitter(1.0) < 1.5
