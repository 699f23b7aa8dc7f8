"""Options decoded once: "window 0 means the whole past" and thread counts (spe.models.config, spe.lab.options)."""

import pytest

from spe.lab.options import MAX_THREADS, check_threads
from spe.models.config import decode_window


def test_window_zero_is_the_whole_past_and_a_positive_window_is_kept():
    assert decode_window(None) is None and decode_window(0) is None and decode_window(7) == 7


@pytest.mark.parametrize("value", [-1, True, 2.0, "8"])
def test_a_bad_window_names_the_option_and_the_value(value):
    with pytest.raises(ValueError, match=rf"^--window must be 0 \(the whole past\) or a positive number of "
                                         rf"positions, got {value!r}$"):
        decode_window(value, "--window")


@pytest.mark.parametrize("value", [-1, True, 1.5, MAX_THREADS + 1, 100000])
def test_a_bad_thread_count_names_the_option_and_the_value(value):
    check_threads(None), check_threads(0), check_threads(MAX_THREADS)
    with pytest.raises(ValueError, match=rf"^threads must be 0 \(PyTorch's default\) or a positive number of "
                                         rf"CPU threads up to {MAX_THREADS} .*, got {value!r}$"):
        check_threads(value)
