//! How a body's value becomes a record and a record becomes a duplicate's
//! value again: JSON, with two guarantees.
//!
//! * **Bit for bit.** Floats are written in their shortest exact form and
//!   read back with serde_json's `float_roundtrip`, so `Duplicate(v)` equals
//!   `Executed(v)` for every finite float, `-0.0` and subnormals included.
//! * **Readable or not written.** A value JSON cannot carry is refused
//!   before anything is recorded ([`Error::Unrecordable`]): NaN and the
//!   infinities (JSON would write `null`, which a duplicate reads as `None`
//!   or cannot read at all); a `Some` whose content JSON writes as `null`
//!   (`Some(())`, `Some(None)`, `Some(Value::Null)`, which would come back as
//!   `None`); and any value whose encoding does not decode into its type
//!   again (a `Deserialize` that refuses its own `Serialize`'s output). So no
//!   duplicate ever meets a record it cannot read, or reads another value.

use std::fmt::{self, Display};

use serde::de::DeserializeOwned;
use serde::{Serialize, ser};

use crate::error::Error;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;

/// How a handler's `Ok` type is recorded and read back: made where the type
/// is known to be storable (`__private::codec`), and handed to the call
/// paths, which then need no serde bounds of their own.
#[doc(hidden)]
pub struct Codec<T> {
    encode: fn(&T) -> Result<String, serde_json::Error>,
    decode: fn(&str) -> Result<T, serde_json::Error>,
}

impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Codec<T> {}

impl<T> std::fmt::Debug for Codec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Codec")
    }
}

impl<T: Serialize + DeserializeOwned> Codec<T> {
    /// JSON, checked as the module says.
    pub(crate) fn new() -> Self {
        Codec {
            encode: encode_checked::<T>,
            decode: |s| serde_json::from_str(s),
        }
    }
}

impl<T> Codec<T> {
    /// `value` as it is recorded, or why it cannot be.
    pub(crate) fn encoded(&self, value: &T) -> Result<String, serde_json::Error> {
        (self.encode)(value)
    }
}

/// Encodes `value`, or says why it cannot be recorded.
fn encode_checked<T: Serialize + DeserializeOwned>(value: &T) -> Result<String, serde_json::Error> {
    value
        .serialize(&mut FiniteCheck::default())
        .map_err(ser::Error::custom)?;
    let encoded = serde_json::to_string(value)?;
    serde_json::from_str::<T>(&encoded).map_err(|e| {
        <serde_json::Error as ser::Error>::custom(format_args!("it would not read back: {e}"))
    })?;
    Ok(encoded)
}

/// Encodes a body's value for the record, or refuses it.
pub(crate) fn encode<T, E>(
    spec: &'static HandlerSpec,
    key: &Key,
    codec: Codec<T>,
    value: &T,
) -> Result<String, Error<E>> {
    codec.encoded(value).map_err(|source| Error::Unrecordable {
        handler: spec.name,
        key: key.clone(),
        source,
    })
}

/// Decodes a recorded outcome for a duplicate.
pub(crate) fn decode<T, E>(
    spec: &'static HandlerSpec,
    key: &Key,
    codec: Codec<T>,
    outcome: &str,
) -> Result<Outcome<T>, Error<E>> {
    (codec.decode)(outcome)
        .map(Outcome::Duplicate)
        .map_err(|source| Error::Codec {
            handler: spec.name,
            key: key.clone(),
            source,
        })
}

/// Walks a value as serde presents it and stops at the first float JSON
/// cannot carry, remembering where it was (`.amount`, `.samples[2]`).
#[derive(Default)]
struct FiniteCheck {
    path: Vec<Step>,
}

enum Step {
    Field(&'static str),
    Index(usize),
    MapValue,
}

/// A float JSON cannot carry, and where.
#[derive(Debug)]
struct NotFinite(String);

impl Display for NotFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotFinite {}

impl ser::Error for NotFinite {
    fn custom<M: Display>(msg: M) -> Self {
        NotFinite(msg.to_string())
    }
}

impl FiniteCheck {
    fn float(&self, value: f64, shown: &dyn Display) -> Result<(), NotFinite> {
        if value.is_finite() {
            return Ok(());
        }
        Err(self.refuse(&format!(
            "{shown}, which JSON cannot carry (it would be recorded as null); return a finite number, or an Option or enum that says what it means"
        )))
    }

    /// `what` is the problem at the current place.
    fn refuse(&self, what: &str) -> NotFinite {
        let mut at = String::new();
        for step in &self.path {
            match step {
                Step::Field(name) => at.push_str(&format!(".{name}")),
                Step::Index(i) => at.push_str(&format!("[{i}]")),
                Step::MapValue => at.push_str("[..]"),
            }
        }
        let at = if at.is_empty() {
            "the result".to_owned()
        } else {
            format!("`{at}`")
        };
        NotFinite(format!("{at} is {what}"))
    }

    fn nested<T: Serialize + ?Sized>(&mut self, step: Step, value: &T) -> Result<(), NotFinite> {
        self.path.push(step);
        value.serialize(&mut *self)?;
        self.path.pop();
        Ok(())
    }
}

/// Scalars that are always fine.
macro_rules! fine {
    ($($method:ident($t:ty)),* $(,)?) => {$(
        fn $method(self, _: $t) -> Result<(), NotFinite> {
            Ok(())
        }
    )*};
}

impl ser::Serializer for &mut FiniteCheck {
    type Ok = ();
    type Error = NotFinite;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fine!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str),
    );

    fn serialize_f32(self, v: f32) -> Result<(), NotFinite> {
        self.float(f64::from(v), &v)
    }
    fn serialize_f64(self, v: f64) -> Result<(), NotFinite> {
        self.float(v, &v)
    }
    fn serialize_none(self) -> Result<(), NotFinite> {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), NotFinite> {
        if value.serialize(NullCheck).unwrap_or(false) {
            return Err(self.refuse(
                "a `Some` whose content JSON writes as null, so it would come back as `None`; return a value that says what it means",
            ));
        }
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), NotFinite> {
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), NotFinite> {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), NotFinite> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), NotFinite> {
        self.nested(Step::Field(variant), value)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self, NotFinite> {
        self.path.push(Step::Index(0));
        Ok(self)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self, NotFinite> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Self, NotFinite> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self, NotFinite> {
        self.path.push(Step::Field(variant));
        self.serialize_seq(Some(len))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, NotFinite> {
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, NotFinite> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self, NotFinite> {
        self.path.push(Step::Field(variant));
        Ok(self)
    }
}

impl FiniteCheck {
    /// The next element of the sequence whose index is on top of the path.
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFinite> {
        value.serialize(&mut *self)?;
        if let Some(Step::Index(i)) = self.path.last_mut() {
            *i += 1;
        }
        Ok(())
    }
}

/// The compound parts whose elements are counted like a sequence's.
macro_rules! sequence {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for &mut FiniteCheck {
            type Ok = ();
            type Error = NotFinite;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFinite> {
                self.element(value)
            }
            fn end(self) -> Result<(), NotFinite> {
                self.path.pop();
                Ok(())
            }
        }
    )*};
}

sequence!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field
);

impl ser::SerializeTupleVariant for &mut FiniteCheck {
    type Ok = ();
    type Error = NotFinite;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFinite> {
        self.element(value)
    }
    fn end(self) -> Result<(), NotFinite> {
        self.path.pop();
        self.path.pop();
        Ok(())
    }
}

impl ser::SerializeMap for &mut FiniteCheck {
    type Ok = ();
    type Error = NotFinite;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NotFinite> {
        // serde_json refuses non-finite float keys itself; checked here so
        // the error says where.
        key.serialize(&mut **self)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFinite> {
        self.nested(Step::MapValue, value)
    }
    fn end(self) -> Result<(), NotFinite> {
        Ok(())
    }
}

impl ser::SerializeStruct for &mut FiniteCheck {
    type Ok = ();
    type Error = NotFinite;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), NotFinite> {
        self.nested(Step::Field(name), value)
    }
    fn end(self) -> Result<(), NotFinite> {
        Ok(())
    }
}

impl ser::SerializeStructVariant for &mut FiniteCheck {
    type Ok = ();
    type Error = NotFinite;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), NotFinite> {
        self.nested(Step::Field(name), value)
    }
    fn end(self) -> Result<(), NotFinite> {
        self.path.pop();
        Ok(())
    }
}

/// Whether a value serializes as JSON `null` at its top level: unit, unit
/// structs, `None`, and newtypes or `Some`s of those.
struct NullCheck;

/// Not null: anything else stops the check at once.
#[derive(Debug)]
struct NotNull;

impl Display for NotNull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not null")
    }
}

impl std::error::Error for NotNull {}

impl ser::Error for NotNull {
    fn custom<M: Display>(_: M) -> Self {
        NotNull
    }
}

/// Scalars and compounds that are never null.
macro_rules! not_null {
    ($($method:ident($($t:ty),*)),* $(,)?) => {$(
        fn $method(self, $(_: $t),*) -> Result<bool, NotNull> {
            Ok(false)
        }
    )*};
}

impl ser::Serializer for NullCheck {
    type Ok = bool;
    type Error = NotNull;
    type SerializeSeq = ser::Impossible<bool, NotNull>;
    type SerializeTuple = ser::Impossible<bool, NotNull>;
    type SerializeTupleStruct = ser::Impossible<bool, NotNull>;
    type SerializeTupleVariant = ser::Impossible<bool, NotNull>;
    type SerializeMap = ser::Impossible<bool, NotNull>;
    type SerializeStruct = ser::Impossible<bool, NotNull>;
    type SerializeStructVariant = ser::Impossible<bool, NotNull>;

    not_null!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_none(self) -> Result<bool, NotNull> {
        Ok(true)
    }
    fn serialize_unit(self) -> Result<bool, NotNull> {
        Ok(true)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<bool, NotNull> {
        Ok(true)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<bool, NotNull> {
        value.serialize(self)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<bool, NotNull> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<bool, NotNull> {
        Ok(false)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotNull> {
        Err(NotNull)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotNull> {
        Err(NotNull)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NotNull> {
        Err(NotNull)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotNull> {
        Err(NotNull)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotNull> {
        Err(NotNull)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, NotNull> {
        Err(NotNull)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotNull> {
        Err(NotNull)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn check<T: Serialize>(value: &T) -> Result<(), String> {
        value
            .serialize(&mut FiniteCheck::default())
            .map_err(|e| e.to_string())
    }

    #[derive(Serialize)]
    struct Reading {
        sensor: String,
        values: Vec<f64>,
        average: Option<f32>,
        by_hour: BTreeMap<u8, f64>,
        kind: Kind,
    }

    #[derive(Serialize)]
    enum Kind {
        Plain,
        Scaled { factor: f64 },
        Pair(f64, f64),
    }

    fn reading() -> Reading {
        Reading {
            sensor: "t-1".into(),
            values: vec![1.5, -0.0, 5e-324],
            average: Some(1.0),
            by_hour: BTreeMap::from([(3, 2.5)]),
            kind: Kind::Plain,
        }
    }

    #[test]
    fn finite_values_pass() {
        assert_eq!(check(&reading()), Ok(()));
        assert_eq!(check(&(1u128 << 100, -7i128, 'x', "s", ())), Ok(()));
    }

    #[test]
    fn non_finite_floats_are_refused_with_their_place() {
        let mut r = reading();
        r.values[2] = f64::NAN;
        assert!(
            check(&r).unwrap_err().starts_with("`.values[2]` is NaN"),
            "{:?}",
            check(&r)
        );
        let mut r = reading();
        r.average = Some(f32::INFINITY);
        assert!(check(&r).unwrap_err().starts_with("`.average` is inf"));
        let mut r = reading();
        r.by_hour.insert(4, f64::NEG_INFINITY);
        assert!(check(&r).unwrap_err().starts_with("`.by_hour[..]` is -inf"));
        let mut r = reading();
        r.kind = Kind::Scaled { factor: f64::NAN };
        assert!(
            check(&r)
                .unwrap_err()
                .starts_with("`.kind.Scaled.factor` is NaN")
        );
        let mut r = reading();
        r.kind = Kind::Pair(1.0, f64::NAN);
        assert!(check(&r).unwrap_err().starts_with("`.kind.Pair[1]` is NaN"));
        assert!(
            check(&f64::NAN)
                .unwrap_err()
                .starts_with("the result is NaN")
        );
    }

    #[test]
    fn a_some_that_json_writes_as_null_is_refused() {
        #[derive(Serialize)]
        struct Marker;
        #[derive(Serialize)]
        struct Wrapper {
            done: Option<()>,
        }
        assert!(
            check(&Some(()))
                .unwrap_err()
                .starts_with("the result is a `Some`")
        );
        assert!(check(&Some(None::<u8>)).is_err());
        assert!(check(&Some(Marker)).is_err());
        assert!(check(&Some(serde_json::Value::Null)).is_err());
        let refused = check(&Wrapper { done: Some(()) }).unwrap_err();
        assert!(refused.starts_with("`.done` is a `Some`"), "{refused}");
        // a Some of anything JSON writes as something else is fine
        assert_eq!(check(&Some(0u8)), Ok(()));
        assert_eq!(check(&Some(vec![()])), Ok(()));
        assert_eq!(check(&Some(String::new())), Ok(()));
        assert_eq!(check(&Wrapper { done: None }), Ok(()));
    }
}
