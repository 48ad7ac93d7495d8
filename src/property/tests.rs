//! Tests of the parent module, in a file of their own (the parent passed 700 lines).

use super::*;

#[test]
fn property_lists_parse_and_plans_follow_the_defaults() {
    assert_eq!(
        Property::parse_list("deterministic,batch-invariant").unwrap(),
        Property::ALL.to_vec()
    );
    assert_eq!(Property::parse_list("all").unwrap(), Property::ALL.to_vec());
    assert!(Property::parse_list("fast").is_err());
    assert!(Property::parse_list("").is_err());
    let c = PropertyConfig::default();
    // Auto: GPU kernels in the production profile only.
    assert_eq!(
        c.plan(true, Profile::Production),
        Plan {
            repeat: 2,
            batch: true
        }
    );
    assert!(c.plan(false, Profile::Production).is_empty());
    assert!(c.plan(true, Profile::All).is_empty());
    // A requirement turns its check on anywhere.
    let r = PropertyConfig {
        require: vec![Property::Deterministic],
        ..Default::default()
    };
    assert_eq!(
        r.plan(false, Profile::All),
        Plan {
            repeat: 2,
            batch: false
        }
    );
    // Explicit settings win over auto.
    let off = PropertyConfig {
        repeat: Some(1),
        batch: Switch::Off,
        require: vec![],
    };
    assert!(off.plan(true, Profile::Production).is_empty());
    let on = PropertyConfig {
        repeat: Some(5),
        batch: Switch::On,
        require: vec![],
    };
    assert_eq!(
        on.plan(false, Profile::Layout),
        Plan {
            repeat: 5,
            batch: true
        }
    );
    // Contradictions are usage errors.
    let bad = PropertyConfig {
        repeat: Some(1),
        require: vec![Property::Deterministic],
        ..Default::default()
    };
    assert!(bad.check().is_err());
    let bad = PropertyConfig {
        batch: Switch::Off,
        require: vec![Property::BatchInvariant],
        ..Default::default()
    };
    assert!(bad.check().is_err());
    assert!(PropertyConfig {
        repeat: Some(0),
        ..Default::default()
    }
    .check()
    .is_err());
}
