"""``adaptplan profile --input`` at its documented limit on non-square shapes (docs/usage.md "Input limits":
``profile --input`` ≤ 2²⁴ values per sample, refused before anything is allocated): the product C·H·W counts,
whichever side is the long one; and a non-square channels-last --input for an image built-in is refused with the
channels-first shape, height before width."""

from __future__ import annotations

import pytest

from adaptplan.cli import main
from adaptplan.cli.commands.profile import parse_shape
from adaptplan.errors import InputError

LIMIT = 2 ** 24


@pytest.mark.parametrize("text, shape", [("1x4096x4096", (1, 4096, 4096)), ("1x8192x2048", (1, 8192, 2048)),
                                         ("1x2048x8192", (1, 2048, 8192)), ("4x1024x4096", (4, 1024, 4096)),
                                         ("1x16777216x1", (1, LIMIT, 1)), ("3x1x5592405", (3, 1, 5592405))])
def test_a_shape_of_at_most_2_24_values_is_taken(text, shape) -> None:
    assert parse_shape(text) == shape and shape[0] * shape[1] * shape[2] <= LIMIT


@pytest.mark.parametrize("text", ["1x4097x4096", "1x4096x4097", "1x8193x2048", "1x2048x8193", "4x1025x4096",
                                  "1x16777217x1", "2x1x8388609", "3x1x5592406"])
def test_one_value_beyond_2_24_is_refused_whichever_side_is_long(text) -> None:
    c, h, w = map(int, text.split("x"))
    assert c * h * w > LIMIT
    with pytest.raises(InputError) as caught:
        parse_shape(text)
    assert caught.value.field == "--input"
    assert f"{text} is {c * h * w:,} values per sample, more than the {LIMIT:,}" in caught.value.message


def test_a_non_square_channels_last_input_is_refused_with_height_before_width(capsys) -> None:
    assert main(["profile", "cnn", "--input", "32x48x3"]) == 2
    err = capsys.readouterr().err
    assert "--input: 32x48x3 looks channels-last; the input is channels × height × width, e.g. 3x32x48" in err
