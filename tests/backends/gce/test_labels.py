"""What marks a GCE resource as a cluster's: labels and firewall descriptions."""

from __future__ import annotations

from transient_nb.backends.gce.labels import (
    LABEL_CLUSTER,
    LABEL_HOST,
    LABEL_ID,
    LABEL_PID,
    firewall_description,
    firewall_id,
    firewall_owner,
    label_value,
    this_host,
)


def test_label_values_are_what_gce_accepts():
    assert label_value("My.Host_Name-1") == "my-host_name-1"
    assert len(label_value("x" * 100)) == 63
    assert this_host() and this_host() == label_value(this_host())


def test_a_firewall_rule_says_whose_it_is_and_a_foreign_one_says_nothing():
    text = firewall_description("Demo", "host-1", 42, "0a1b2c")
    rule = {"description": text}
    assert firewall_owner(rule) == {
        LABEL_CLUSTER: "demo",
        LABEL_HOST: "host-1",
        LABEL_PID: "42",
        LABEL_ID: "0a1b2c",
    }
    assert firewall_id(rule) == "0a1b2c"
    # Someone else's rule, or one of ours from before ids: not taken for this cluster's.
    assert firewall_owner({"description": "allow 8786 for the team"}) is None
    assert firewall_id({}) is None
    old = {"description": "transient_nb cluster demo (host h, pid 7): ports"}
    assert firewall_owner(old) == {LABEL_CLUSTER: "demo", LABEL_HOST: "h", LABEL_PID: "7"}
    assert firewall_id(old) is None


def test_an_owner_is_hashed_to_a_label_and_a_lease_is_renewed_in_a_rules_description():
    from transient_nb.backends.gce.labels import (
        LABEL_LEASE,
        LABEL_OWNER,
        lease_of,
        owner_identity,
        owner_label,
        renewed_description,
    )

    alice = owner_label("Alice@Example.com")
    assert alice == owner_label("alice@example.com") == label_value(alice) and len(alice) == 16
    assert alice != owner_label("bob@example.com")
    assert owner_identity("carol@example.com", None) == "carol@example.com"
    assert "@" in owner_identity(None, object())  # no account to say: user@host
    text = firewall_description("demo", "h", 1, "ab12", owner=alice, lease="100")
    owner = firewall_owner({"description": text})
    assert owner is not None and owner[LABEL_OWNER] == alice and owner[LABEL_LEASE] == "100"
    renewed = renewed_description(text, "250")
    assert firewall_owner({"description": renewed})[LABEL_LEASE] == "250"  # type: ignore[index]
    assert firewall_id({"description": renewed}) == "ab12"
    # A rule from before leases gets one.
    old = firewall_description("demo", "h", 1, "ab12")
    assert (
        lease_of(firewall_owner({"description": renewed_description(old, "7")})[LABEL_LEASE]) == 7
    )  # type: ignore[index]
