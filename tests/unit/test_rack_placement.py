"""Rack-aware placement (common/ledger/placement.py) and the rack information document
(common/ledger/racks.py, Pulsar's BookiesRackConfiguration)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.common.ledger.bookies import BookieRegistration
from magnetar.common.ledger.ensemble import plan_change
from magnetar.common.ledger.placement import NotEnoughBookiesError, RackAwarePlacement
from magnetar.common.ledger.racks import (
    DEFAULT_RACK,
    BookieRackInfo,
    InvalidRackError,
    RackConfiguration,
    normalize_rack,
)


def bookie(address: str, rack: str | None = None, read_only: bool = False) -> BookieRegistration:
    return BookieRegistration(address, "", read_only, 0, 0).on_rack(rack)


def racks_of(chosen: list[str], bookies: list[BookieRegistration]) -> list[str]:
    by_address = {b.address: b.rack or DEFAULT_RACK for b in bookies}
    return [by_address[a] for a in chosen]


def test_an_ensemble_goes_on_distinct_racks_when_there_are_enough() -> None:
    bookies = [bookie(f"r{r}-b{i}", f"/rack-{r}") for r in range(3) for i in range(4)]
    for seed in range(50):
        chosen = RackAwarePlacement(random.Random(seed)).choose(3, bookies)
        assert sorted(racks_of(chosen, bookies)) == ["/rack-0", "/rack-1", "/rack-2"]


def test_fewer_racks_than_bookies_needed_is_not_a_failure_racks_are_used_evenly() -> None:
    bookies = [bookie(f"r{r}-b{i}", f"/rack-{r}") for r in range(2) for i in range(3)]
    for seed in range(50):
        chosen = RackAwarePlacement(random.Random(seed)).choose(4, bookies)
        assert len(set(chosen)) == 4
        assert sorted(racks_of(chosen, bookies)) == ["/rack-0", "/rack-0", "/rack-1", "/rack-1"]


def test_a_replacement_avoids_the_racks_the_rest_of_the_ensemble_is_on() -> None:
    bookies = [
        bookie("a", "/r1"),
        bookie("b", "/r2"),
        bookie("c", "/r3"),  # failed
        bookie("d", "/r1"),
        bookie("e", "/r2"),
        bookie("f", "/r4"),
    ]
    for seed in range(30):
        change = plan_change(
            ("a", "b", "c"), 5, [2], bookies, RackAwarePlacement(random.Random(seed))
        )
        assert change.replaced == {"c": "f"}


def test_without_rack_information_every_writable_bookie_can_be_chosen() -> None:
    bookies = [bookie(a) for a in "abcde"] + [bookie("ro", read_only=True)]
    seen: set[str] = set()
    for seed in range(200):
        seen.update(RackAwarePlacement(random.Random(seed)).choose(2, bookies, exclude={"e"}))
    assert seen == set("abcd")


def test_it_fails_only_for_want_of_writable_bookies() -> None:
    bookies = [bookie("a", "/r1"), bookie("b", "/r1"), bookie("c", "/r2", read_only=True)]
    assert sorted(RackAwarePlacement().choose(2, bookies)) == ["a", "b"]
    with pytest.raises(NotEnoughBookiesError):
        RackAwarePlacement().choose(3, bookies)


@given(
    racks=st.lists(st.sampled_from(["/r1", "/r2", "/r3", "/r4", None]), min_size=1, max_size=12),
    read_only=st.sets(st.integers(0, 11)),
    excluded=st.sets(st.integers(0, 11)),
    count=st.integers(1, 6),
    seed=st.integers(0, 1000),
)
def test_choice_is_distinct_writable_outside_exclude_and_spreads_over_racks(
    racks: list[str | None], read_only: set[int], excluded: set[int], count: int, seed: int
) -> None:
    bookies = [bookie(f"b{i}", rack, i in read_only) for i, rack in enumerate(racks)]
    exclude = {f"b{i}" for i in excluded}
    candidates = [b for b in bookies if not b.read_only and b.address not in exclude]
    if len(candidates) < count:
        with pytest.raises(NotEnoughBookiesError):
            RackAwarePlacement(random.Random(seed)).choose(count, bookies, exclude)
        return
    chosen = RackAwarePlacement(random.Random(seed)).choose(count, bookies, exclude)
    assert len(set(chosen)) == count
    assert all(a in {b.address for b in candidates} for a in chosen)
    used_by_excluded = {b.rack or DEFAULT_RACK for b in bookies if b.address in exclude}
    free_racks = {b.rack or DEFAULT_RACK for b in candidates} - used_by_excluded
    chosen_racks = racks_of(chosen, bookies)
    # As many distinct racks as could be had: never a rack twice while a free one was left.
    assert len(set(chosen_racks)) >= min(count, len(free_racks))


def test_rack_configuration_is_pulsars_json_shape() -> None:
    config = RackConfiguration.empty()
    config.update("default", "10.0.0.1:3181", BookieRackInfo("/rack-a", "bk1.example"))
    config.update("default", "10.0.0.2:3181", BookieRackInfo("/rack-b"))
    assert config.to_dict() == {
        "default": {
            "10.0.0.1:3181": {"rack": "/rack-a", "hostname": "bk1.example"},
            "10.0.0.2:3181": {"rack": "/rack-b"},
        }
    }
    # A bookie lives in one group: setting it in another moves it; an emptied group goes.
    config.update("east", "10.0.0.2:3181", BookieRackInfo("/rack-c"))
    assert set(config.to_dict()) == {"default", "east"}
    assert config.get("10.0.0.2:3181") == BookieRackInfo("/rack-c")
    assert RackConfiguration.from_json(config.to_json()) == config
    assert config.remove("10.0.0.2:3181") and not config.remove("10.0.0.2:3181")
    assert set(config.to_dict()) == {"default"}
    assert config.racks() == {"10.0.0.1:3181": "/rack-a"}


@pytest.mark.parametrize(
    ("given_rack", "stored"),
    [("rack-a", "/rack-a"), ("/rack-a", "/rack-a"), ("/rack-a/", "/rack-a"), ("", DEFAULT_RACK)],
)
def test_rack_names(given_rack: str, stored: str) -> None:
    assert normalize_rack(given_rack) == stored


@pytest.mark.parametrize(
    "body",
    [{"rack": "region/rack"}, {"hostname": "h"}, {"rack": 3}, [], {"rack": "r", "hostname": 1}],
)
def test_bad_rack_information_is_refused(body: object) -> None:
    with pytest.raises(InvalidRackError):
        BookieRackInfo.from_dict(body)


def test_a_damaged_document_is_a_value_error() -> None:
    for raw in (b"[1]", b'{"g": 3}', b"not json"):
        with pytest.raises(ValueError):
            RackConfiguration.from_json(raw)
    assert RackConfiguration.from_json(json.dumps({}).encode()) == RackConfiguration.empty()
