from engines.detok import Detokenizer


def make(pieces: list[str], stops: tuple[str, ...]) -> Detokenizer:
    # token id i decodes to pieces[i]
    return Detokenizer(lambda ids: "".join(pieces[i] for i in ids), stops)


def test_stop_sequence_split_across_tokens_is_cut_and_never_streamed() -> None:
    pieces = ["Hello", " wor", "ld", "\nUs", "er:", " more"]
    d = make(pieces, ("\nUser:",))
    streamed = "".join(d.push(i) for i in range(5))
    assert d.stopped and streamed == "Hello world" and d.text == "Hello world"


def test_text_that_only_looked_like_a_stop_is_released() -> None:
    d = make(["a", "\nU", "p"], ("\nUser:",))
    assert d.push(0) == "a"
    assert d.push(1) == ""  # could still become "\nUser:"
    assert d.push(2) == "\nUp"
    assert not d.stopped


def test_partial_utf8_character_is_held_until_complete() -> None:
    # "é" spans two tokens: decoding only its first byte gives U+FFFD.
    texts = {1: "caf", 2: "caf\ufffd", 3: "café!"}
    d = Detokenizer(lambda ids: texts[len(ids)], ())
    assert d.push(0) == "caf"
    assert d.push(1) == ""
    assert d.push(2) == "é!"


def test_flush_releases_held_text_at_the_end() -> None:
    d = make(["x", "\n"], ("\nEND",))
    assert d.push(0) + d.push(1) == "x"
    assert d.flush() == "\n"
