from llamacy.stopping import StopMatcher


def feed_all(m: StopMatcher, pieces: list[str]) -> str:
    out = "".join(m.feed(p) for p in pieces)
    return out + m.flush()


def test_no_stops_passes_through():
    assert feed_all(StopMatcher(), ["a", "b", "c"]) == "abc"


def test_stop_split_across_pieces_is_not_printed():
    m = StopMatcher(["\nUser:"])
    assert feed_all(m, ["Hello", " there\n", "Us", "er:", " more"]) == "Hello there"
    assert m.stopped


def test_partial_match_that_fails_is_released():
    m = StopMatcher(["STOP"])
    assert m.feed("abST") == "ab"  # "ST" could still become STOP
    assert m.feed("xy") == "STxy"
    assert not m.stopped


def test_held_back_tail_released_at_flush():
    m = StopMatcher(["STOP"])
    assert m.feed("endSTO") == "end"
    assert m.flush() == "STO"


def test_earliest_of_several_stops_wins():
    m = StopMatcher(["cd", "b"])
    assert feed_all(m, ["abcd"]) == "a"


def test_nothing_after_stop():
    m = StopMatcher(["x"])
    assert m.feed("ax") == "a"
    assert m.feed("more") == ""
    assert m.flush() == ""
