"""Which policy applies, and the settings it gives with an operator policy and a queue's arguments
(RabbitMQ 3.10's rules: docs/rabbitmq-policies.md)."""

from __future__ import annotations

import pytest

from postroom.broker.core.policy import (
    Policy,
    alternate_exchange,
    choose,
    effective_definition,
    queue_arguments,
    validate,
)


def test_the_pattern_is_searched_not_anchored_and_apply_to_picks_the_kind() -> None:
    policy = Policy("dlx", r"orders\.", {"dead-letter-exchange": "dlx"}, apply_to="queues")
    assert policy.matches("queue", "eu.orders.created") and not policy.matches("queue", "orders")
    assert not policy.matches("exchange", "orders.x")
    assert Policy("all", "^$", {"alternate-exchange": "ae"}).matches("exchange", "")


def test_the_highest_priority_applies_and_equals_go_by_name() -> None:
    low = Policy("low", ".*", {"max-length": 1}, priority=1)
    high = Policy("high", "^q", {"max-length": 2}, priority=5)
    twin = Policy("a-twin", "^q", {"max-length": 3}, priority=5)
    assert choose([low, high], "queue", "q1") is high
    assert choose([low, high], "queue", "other") is low
    assert choose([high, twin, low], "queue", "q1") is twin
    assert choose([twin, high, low], "queue", "q1") is twin
    assert choose([high], "exchange", "x") is None


def test_an_operator_policy_caps_the_user_policy_and_the_arguments_cap_both() -> None:
    user = Policy("user", ".*", {"max-length": 100, "message-ttl": 5_000, "dead-letter-exchange": "dlx"})
    operator = Policy("op", ".*", {"max-length": 10, "expires": 60_000})
    assert effective_definition(user, operator) == {
        "max-length": 10,
        "message-ttl": 5_000,
        "dead-letter-exchange": "dlx",
        "expires": 60_000,
    }
    arguments = {"x-max-length": 50, "x-message-ttl": 1_000, "x-dead-letter-exchange": "own", "x-expires": 90_000}
    assert queue_arguments(arguments, user, operator) == {
        "x-max-length": 10,  # the lowest of the three
        "x-message-ttl": 1_000,  # the argument is lower
        "x-dead-letter-exchange": "own",  # the argument wins
        "x-expires": 60_000,
    }
    assert queue_arguments({}, None, None) == {}
    assert queue_arguments({"x-overflow": "reject-publish"}, Policy("p", ".*", {"overflow": "drop-head"}), None) == {
        "x-overflow": "reject-publish"
    }


def test_an_exchange_argument_wins_over_the_policy_alternate_exchange() -> None:
    policy = Policy("ae", ".*", {"alternate-exchange": "from-policy"})
    assert alternate_exchange({}, policy) == "from-policy"
    assert alternate_exchange({"alternate-exchange": "own"}, policy) == "own"
    assert alternate_exchange({}, None) is None


@pytest.mark.parametrize(
    ("definition", "operator", "problems"),
    [
        ({"message-ttl": 1_000, "dead-letter-exchange": "dlx"}, False, []),
        ({}, False, ["no policy provided"]),
        ([1], False, ["definition must be a dictionary: [1]"]),
        ({"message-ttl": -1}, False, ["-1 is not a valid message TTL"]),
        ({"expires": 0}, False, ["0 is not a valid queue expiry"]),
        ({"overflow": "drop-tail"}, False, ['<<"drop-tail">> is not a valid overflow value']),
        ({"max-length": "10"}, False, ['<<"10">> is not a valid maximum length']),
        ({"max-priority": 10}, False, ['[{<<"max-priority">>,10}] are not recognised policy settings']),
        # A refused value hides the unknown keys, as in RabbitMQ.
        ({"max-priority": 10, "max-length": -2}, False, ["-2 is not a valid maximum length"]),
        ({"overflow": "drop-head"}, True, ['[{<<"overflow">>,<<"drop-head">>}] are not recognised policy settings']),
        ({"max-length": 5, "delivery-limit": 3}, True, []),
    ],
)
def test_definitions_are_checked_with_rabbitmqs_words(definition: object, operator: bool, problems: list[str]) -> None:
    assert validate(definition, operator) == problems


def test_a_bad_pattern_or_apply_to_is_refused() -> None:
    with pytest.raises(ValueError, match="pattern should be regular expression but is invalid"):
        Policy("bad", "(", {"max-length": 1})
    with pytest.raises(ValueError, match="apply-to 'classic_queues' unrecognised"):
        Policy("bad", ".*", {"max-length": 1}, apply_to="classic_queues")
