//! The Nomad volume ID: the one name of a volume that paths, registry records
//! and metric labels are built from. In core because the record the plugin
//! writes and the exporter reads embeds it, and both must refuse the same IDs.

use std::fmt;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::quoted::shown;

/// A well-formed ID for messages that tell the operator what one looks like.
pub const EXAMPLE_UUID: &str = "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";

/// Why a string is not a [`VolumeId`].
#[derive(Debug, thiserror::Error)]
#[error(
    "volume ID {} is not a Nomad volume ID: expected a UUID of 8-4-4-4-12 \
     hexadecimal digits such as {EXAMPLE_UUID}",
    shown(.value)
)]
pub struct InvalidVolumeId {
    pub value: String,
}

/// A Nomad volume ID: a UUID in its 36-character hyphenated form, lowercase.
///
/// The volume's directory is `<volumes dir>/<volume ID>`, so this type is what
/// keeps a hostile ID (`../..`, `/`, NUL, newline) out of every path. Only the
/// exact 8-4-4-4-12 hex form is accepted; uppercase is folded to lowercase so
/// that one volume cannot have two directories or two registry records.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VolumeId(String);

impl VolumeId {
    pub fn parse(s: &str) -> Result<Self, InvalidVolumeId> {
        let well_formed = s.len() == 36
            && s.bytes().enumerate().all(|(i, b)| match i {
                8 | 13 | 18 | 23 => b == b'-',
                _ => b.is_ascii_hexdigit(),
            });
        if well_formed {
            Ok(VolumeId(s.to_ascii_lowercase()))
        } else {
            Err(InvalidVolumeId {
                value: s.to_owned(),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for VolumeId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for VolumeId {
    type Err = InvalidVolumeId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        VolumeId::parse(s)
    }
}

impl Serialize for VolumeId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for VolumeId {
    // Records on disk are as untrusted as the environment: a tampered
    // registry file must not smuggle a path into a volume ID.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        VolumeId::parse(&s).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";

    #[test]
    fn volume_id_rules() {
        let id = VolumeId::parse(&ID.to_uppercase()).unwrap();
        assert_eq!(id.as_str(), ID);
        assert_eq!(id.to_string(), ID);
        assert_eq!(id, ID.parse::<VolumeId>().unwrap());
        for bad in [
            "",
            "abc",
            "../x",
            &ID[1..],
            &format!("{ID}0"),
            &format!(" {}", &ID[1..]),
            &ID.replace('-', "_"),
            "8f3e9d2c-4b1a-4c6e-9a7d2-e5b6c1f0a93",
        ] {
            assert!(
                matches!(VolumeId::parse(bad), Err(InvalidVolumeId { .. })),
                "{bad:?}"
            );
        }
        let msg = VolumeId::parse("../x").unwrap_err().to_string();
        assert!(
            msg.contains("\"../x\"") && msg.contains("8-4-4-4-12"),
            "{msg}"
        );
    }

    #[test]
    fn volume_id_serde_is_a_validated_string() {
        let id = VolumeId::parse(ID).unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{ID}\""));
        let back: VolumeId = serde_json::from_str(&format!("\"{}\"", ID.to_uppercase())).unwrap();
        assert_eq!(back, id);
        let err = serde_json::from_str::<VolumeId>("\"../../etc\"").unwrap_err();
        assert!(err.to_string().contains("not a Nomad volume ID"), "{err}");
        assert!(serde_json::from_str::<VolumeId>("42").is_err());
    }
}
