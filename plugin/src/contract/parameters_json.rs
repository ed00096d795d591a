//! `DHV_PARAMETERS`: a JSON object of strings, parsed strictly (no duplicate
//! keys, no non-string values, bounded sizes) into [`Parameters`]. What the
//! parameters mean is `crate::param_check`'s concern.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::Parameters;
use crate::input_bounds::{MAX_PARAMETERS_LEN, MAX_PARAMETER_KEY_LEN, MAX_PARAMETER_VALUE_LEN};
use crate::input_error::InputError;

pub(super) fn parameters(value: Option<&str>) -> Result<Parameters, InputError> {
    let Some(value) = value else {
        return Ok(Parameters::new());
    };
    if value.is_empty() {
        return Ok(Parameters::new());
    }
    if value.len() > MAX_PARAMETERS_LEN {
        return Err(InputError::ParametersTooLarge { len: value.len() });
    }
    let problem = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(value);
    let parsed = ParametersSeed { problem: &problem }
        .deserialize(&mut de)
        .and_then(|params| de.end().map(|()| params));
    if let Some(problem) = problem.into_inner() {
        return Err(problem);
    }
    parsed.map_err(|e| InputError::ParametersSyntax {
        message: e.to_string(),
    })
}

/// Parses the parameters object. Problems are reported through `problem` as
/// typed errors; the serde error returned alongside only stops serde_json.
/// A plain `BTreeMap` would silently keep the last of two duplicate keys.
struct ParametersSeed<'a> {
    problem: &'a RefCell<Option<InputError>>,
}

impl ParametersSeed<'_> {
    fn fail<E: de::Error, T>(&self, problem: InputError) -> Result<T, E> {
        *self.problem.borrow_mut() = Some(problem);
        Err(E::custom("invalid DHV_PARAMETERS"))
    }

    fn not_object<E: de::Error, T>(&self, found: &'static str) -> Result<T, E> {
        self.fail(InputError::ParametersNotObject { found })
    }
}

impl<'de> DeserializeSeed<'de> for ParametersSeed<'_> {
    type Value = Parameters;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Parameters, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ParametersSeed<'_> {
    type Value = Parameters;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of strings, or null")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Parameters, E> {
        Ok(Parameters::new())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Parameters, E> {
        self.not_object("a boolean")
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Parameters, E> {
        self.not_object("a number")
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Parameters, E> {
        self.not_object("a number")
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Parameters, E> {
        self.not_object("a number")
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Parameters, E> {
        self.not_object("a string")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Parameters, A::Error> {
        self.not_object("an array")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parameters, A::Error> {
        let mut out = Parameters::new();
        while let Some(key) = map.next_key::<String>()? {
            let reason = if key.is_empty() {
                Some("empty; give every parameter a name in the volume spec".to_owned())
            } else if key.len() > MAX_PARAMETER_KEY_LEN {
                Some(format!(
                    "{} bytes long, more than the {MAX_PARAMETER_KEY_LEN} this plugin accepts; \
                     the parameters it knows have short names",
                    key.len()
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return self.fail(InputError::InvalidParameterName { key, reason });
            }
            if out.contains_key(&key) {
                return self.fail(InputError::DuplicateParameter { key });
            }
            let value = map.next_value_seed(StringValue {
                problem: self.problem,
                key: &key,
            })?;
            if value.len() > MAX_PARAMETER_VALUE_LEN {
                return self.fail(InputError::ParameterValueTooLong {
                    key,
                    len: value.len(),
                });
            }
            out.insert(key, value);
        }
        Ok(out)
    }
}

/// One parameter value: a JSON string, and nothing else. Arrays and objects
/// are refused without being descended into, so nesting depth costs nothing.
struct StringValue<'a> {
    problem: &'a RefCell<Option<InputError>>,
    key: &'a str,
}

impl StringValue<'_> {
    fn not_string<E: de::Error>(&self, found: &'static str) -> Result<String, E> {
        *self.problem.borrow_mut() = Some(InputError::ParameterNotString {
            key: self.key.to_owned(),
            found,
        });
        Err(E::custom("invalid DHV_PARAMETERS"))
    }
}

impl<'de> DeserializeSeed<'de> for StringValue<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringValue<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        self.not_string("null")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<String, E> {
        self.not_string("a boolean")
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<String, E> {
        self.not_string("a number")
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<String, E> {
        self.not_string("a number")
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<String, E> {
        self.not_string("a number")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<String, A::Error> {
        self.not_string("an array")
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<String, A::Error> {
        self.not_string("an object")
    }
}
