//! The canonical encoding keys are digested from: MessagePack with named
//! fields, as stored records are, except that the entries of every map are
//! written sorted by their encoded key bytes, at every depth, and so are
//! the elements of a `HashSet`. Equal values then always give equal bytes,
//! whatever order their maps and sets iterate in.
//!
//! Everything that is not a map or a set is written as `rmp-serde` writes
//! it (scalars are handed to `rmp-serde` itself), so a value without maps
//! or sets encodes to exactly its stored bytes: a struct is a map of its
//! fields in declaration order, as in a record, and is not sorted. A
//! `#[serde(flatten)]` struct serializes as a map and is sorted.
//!
//! Serde gives a set no mark of its own (a `HashSet` serializes as a
//! sequence, like a `Vec`), so sets are recognised by type name: the
//! standard library's and `hashbrown`'s `HashSet`. Any other collection
//! whose iteration order is not a function of its value needs a
//! deterministic `Serialize` to get a stable key.

use std::any::type_name;

use rmp::encode::{write_array_len, write_map_len, write_str};
use rmp_serde::encode::Error;
use serde::ser::{self, Serialize, SerializeMap, SerializeSeq, Serializer};

/// How deeply compound values may nest (as `rmp-serde` allows).
const MAX_DEPTH: usize = 1024;

/// The canonical encoding of `value`.
///
/// # Errors
/// What `rmp-serde` reports for the value (an unsupported type, a
/// `Serialize` that breaks serde's data model), or
/// [`Error::DepthLimitExceeded`] past 1024 nested compounds.
pub(crate) fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    encoded(value, MAX_DEPTH)
}

fn encoded<T: Serialize + ?Sized>(value: &T, depth: usize) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    value.serialize(Canonical {
        out: &mut out,
        depth,
    })?;
    Ok(out)
}

/// Whether `I`, a collection serde serializes as a sequence, is a hash set.
fn is_hash_set<I>() -> bool {
    let name = type_name::<I>().trim_start_matches('&');
    [
        "std::collections::hash::set::HashSet<",
        "hashbrown::set::HashSet<",
    ]
    .iter()
    .any(|set| name.starts_with(set))
}

fn len_u32(len: usize) -> Result<u32, Error> {
    u32::try_from(len)
        .map_err(|_| Error::InvalidDataModel("a collection of more than u32::MAX items"))
}

/// The serializer of one value into `out`.
struct Canonical<'a> {
    out: &'a mut Vec<u8>,
    /// Compound levels still allowed below this value.
    depth: usize,
}

impl<'a> Canonical<'a> {
    /// Write `value` as `rmp-serde` writes it.
    fn leaf<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        rmp_serde::encode::write_named(self.out, value)
    }

    /// The depth left for the items of a compound value.
    fn inner_depth(&self) -> Result<usize, Error> {
        self.depth.checked_sub(1).ok_or(Error::DepthLimitExceeded)
    }

    /// Items written in order after a header already written.
    fn direct(self) -> Result<Direct<'a>, Error> {
        let depth = self.inner_depth()?;
        Ok(Direct {
            out: self.out,
            depth,
        })
    }
}

/// `bytes` as MessagePack bin.
struct Bin<'a>(&'a [u8]);

impl Serialize for Bin<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// An `rmp-serde` extension value, handed to `rmp-serde` whole.
struct Ext<'a, T: ?Sized>(&'a T);

impl<T: Serialize + ?Sized> Serialize for Ext<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_newtype_struct(rmp_serde::MSGPACK_EXT_STRUCT_NAME, self.0)
    }
}

impl<'a> Serializer for Canonical<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Buffered<'a>;
    type SerializeTuple = Direct<'a>;
    type SerializeTupleStruct = Direct<'a>;
    type SerializeTupleVariant = Direct<'a>;
    type SerializeMap = Sorted<'a>;
    type SerializeStruct = Direct<'a>;
    type SerializeStructVariant = Direct<'a>;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.leaf(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        self.leaf(&Bin(v))
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.leaf(&())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.leaf(&())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        write_array_len(self.out, 0)?;
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.leaf(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        if name == rmp_serde::MSGPACK_EXT_STRUCT_NAME {
            return self.leaf(&Ext(value));
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        let depth = self.inner_depth()?;
        write_map_len(self.out, 1)?;
        write_str(self.out, variant)?;
        value.serialize(Canonical {
            out: self.out,
            depth,
        })
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Buffered<'a>, Error> {
        let depth = self.inner_depth()?;
        Ok(Buffered {
            out: self.out,
            depth,
            len,
            items: Vec::new(),
            count: 0,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Direct<'a>, Error> {
        write_array_len(self.out, len_u32(len)?)?;
        self.direct()
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Direct<'a>, Error> {
        write_array_len(self.out, len_u32(len)?)?;
        self.direct()
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Direct<'a>, Error> {
        write_map_len(self.out, 1)?;
        write_str(self.out, variant)?;
        write_array_len(self.out, len_u32(len)?)?;
        self.direct()
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Sorted<'a>, Error> {
        let depth = self.inner_depth()?;
        Ok(Sorted {
            out: self.out,
            depth,
            len,
            entries: Vec::new(),
            key: None,
        })
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Direct<'a>, Error> {
        write_map_len(self.out, len_u32(len)?)?;
        self.direct()
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Direct<'a>, Error> {
        write_map_len(self.out, 1)?;
        write_str(self.out, variant)?;
        write_map_len(self.out, len_u32(len)?)?;
        self.direct()
    }

    fn collect_seq<I>(self, iter: I) -> Result<(), Error>
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        let set = is_hash_set::<I>();
        let iter = iter.into_iter();
        if !set {
            let len = match iter.size_hint() {
                (lo, Some(hi)) if lo == hi => Some(lo),
                _ => None,
            };
            let mut seq = self.serialize_seq(len)?;
            for item in iter {
                seq.serialize_element(&item)?;
            }
            return seq.end();
        }
        let depth = self.inner_depth()?;
        let mut items = iter
            .map(|item| encoded(&item, depth))
            .collect::<Result<Vec<_>, _>>()?;
        items.sort_unstable();
        write_array_len(self.out, len_u32(items.len())?)?;
        for item in items {
            self.out.extend_from_slice(&item);
        }
        Ok(())
    }
}

/// The items of a compound whose header is written: each follows the
/// previous one (struct fields by name, in declaration order).
struct Direct<'a> {
    out: &'a mut Vec<u8>,
    depth: usize,
}

impl Direct<'_> {
    fn item<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(Canonical {
            out: self.out,
            depth: self.depth,
        })
    }

    fn field<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) -> Result<(), Error> {
        write_str(self.out, name)?;
        self.item(value)
    }
}

/// The compound serializers of [`Direct`]: each element goes through
/// [`Direct::item`], each named field through [`Direct::field`]; nothing
/// is written at the end (the header carried the length).
macro_rules! direct_compound {
    ($($trait:ident :: $method:ident ($($name:ident)?) => $write:ident;)*) => {$(
        impl ser::$trait for Direct<'_> {
            type Ok = ();
            type Error = Error;
            fn $method<T: Serialize + ?Sized>(
                &mut self,
                $($name: &'static str,)?
                value: &T,
            ) -> Result<(), Error> {
                self.$write($($name,)? value)
            }
            fn end(self) -> Result<(), Error> {
                Ok(())
            }
        }
    )*};
}

direct_compound! {
    SerializeTuple::serialize_element() => item;
    SerializeTupleStruct::serialize_field() => item;
    SerializeTupleVariant::serialize_field() => item;
    SerializeStruct::serialize_field(name) => field;
    SerializeStructVariant::serialize_field(name) => field;
}

/// A sequence, buffered so that one of unknown length gets its count in
/// the header (as `rmp-serde` does).
struct Buffered<'a> {
    out: &'a mut Vec<u8>,
    depth: usize,
    len: Option<usize>,
    items: Vec<u8>,
    count: usize,
}

impl SerializeSeq for Buffered<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(Canonical {
            out: &mut self.items,
            depth: self.depth,
        })?;
        self.count += 1;
        Ok(())
    }
    fn end(self) -> Result<(), Error> {
        write_array_len(self.out, len_u32(self.len.unwrap_or(self.count))?)?;
        self.out.extend_from_slice(&self.items);
        Ok(())
    }
}

/// A map's entries, each encoded on its own, written sorted by key bytes.
struct Sorted<'a> {
    out: &'a mut Vec<u8>,
    depth: usize,
    len: Option<usize>,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    key: Option<Vec<u8>>,
}

impl SerializeMap for Sorted<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key = Some(encoded(key, self.depth)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or(Error::InvalidDataModel("a map value without its key"))?;
        self.entries.push((key, encoded(value, self.depth)?));
        Ok(())
    }
    fn end(mut self) -> Result<(), Error> {
        // Equal keys (a `Serialize` that repeats one) fall back on the
        // values, so the order is still a function of the entries.
        self.entries.sort_unstable();
        write_map_len(self.out, len_u32(self.len.unwrap_or(self.entries.len()))?)?;
        for (key, value) in self.entries {
            self.out.extend_from_slice(&key);
            self.out.extend_from_slice(&value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

    use serde::Serialize;

    use super::*;

    /// Every shape of serde's data model but maps and sets.
    #[derive(Serialize)]
    struct NoMaps {
        zeta: u8,
        alpha: i64,
        negative: i32,
        big: u64,
        wide: i128,
        float: f32,
        double: f64,
        flag: bool,
        letter: char,
        text: String,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
        list: Vec<Shape>,
        tuple: (u8, String),
        unit: (),
        nothing: Option<u8>,
        something: Option<Vec<u16>>,
        marker: Marker,
        newtype: Meters,
        pair: Pair,
        unknown_length: UnknownLength,
    }

    #[derive(Serialize)]
    enum Shape {
        Unit,
        Newtype(u32),
        Tuple(u8, u8),
        Struct { b: u8, a: u8 },
    }

    #[derive(Serialize)]
    struct Marker;

    #[derive(Serialize)]
    struct Meters(f64);

    #[derive(Serialize)]
    struct Pair(u8, String);

    /// A sequence that does not say its length up front.
    struct UnknownLength;

    impl Serialize for UnknownLength {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let mut seq = serializer.serialize_seq(None)?;
            for i in 0..3u8 {
                seq.serialize_element(&i)?;
            }
            seq.end()
        }
    }

    fn no_maps() -> NoMaps {
        NoMaps {
            zeta: 200,
            alpha: -70_000,
            negative: -3,
            big: u64::MAX,
            wide: -(1 << 100),
            float: 1.5,
            double: -0.25,
            flag: true,
            letter: 'é',
            text: "x".repeat(300),
            bytes: vec![0, 1, 2, 255],
            list: vec![
                Shape::Unit,
                Shape::Newtype(70_000),
                Shape::Tuple(1, 2),
                Shape::Struct { b: 2, a: 1 },
            ],
            tuple: (7, "t".into()),
            unit: (),
            nothing: None,
            something: Some(vec![1, 300]),
            marker: Marker,
            newtype: Meters(2.5),
            pair: Pair(1, "p".into()),
            unknown_length: UnknownLength,
        }
    }

    #[test]
    fn a_value_without_maps_encodes_to_its_stored_bytes() {
        let value = no_maps();
        assert_eq!(
            to_vec(&value).unwrap(),
            rmp_serde::to_vec_named(&value).unwrap()
        );
        // Struct fields keep their declaration order.
        let bytes = to_vec(&Shape::Struct { b: 2, a: 1 }).unwrap();
        let b = bytes.iter().position(|&x| x == b'b').unwrap();
        let a = bytes.iter().position(|&x| x == b'a').unwrap();
        assert!(b < a);
    }

    /// Maps with the same entries inserted in opposite orders.
    fn maps<K: Clone + Eq + std::hash::Hash, V: Clone>(
        entries: &[(K, V)],
    ) -> (HashMap<K, V>, HashMap<K, V>) {
        let forward = entries.iter().cloned().collect();
        let backward = entries.iter().rev().cloned().collect();
        (forward, backward)
    }

    #[test]
    fn map_entries_are_sorted_by_their_encoded_keys_at_every_depth() {
        let entries: Vec<(String, u32)> = (0..64).map(|i| (format!("key-{i}"), i)).collect();
        let (a, b) = maps(&entries);
        assert_eq!(to_vec(&a).unwrap(), to_vec(&b).unwrap());

        // The bytes are those of the entries in encoded-key order: a
        // shorter string's header sorts first, then byte order.
        let mut small = BTreeMap::new();
        small.insert("bb".to_string(), 1u8);
        small.insert("c".to_string(), 2u8);
        small.insert("a".to_string(), 3u8);
        let mut expected = vec![0x83];
        for (key, value) in [("a", 3u8), ("c", 2), ("bb", 1)] {
            expected.extend(rmp_serde::to_vec(key).unwrap());
            expected.push(value);
        }
        assert_eq!(to_vec(&small).unwrap(), expected);

        // Nested maps, maps inside arrays and inside enum variants.
        #[derive(Serialize)]
        struct Nested {
            outer: HashMap<u64, HashMap<String, Vec<u8>>>,
            list: Vec<HashMap<i32, bool>>,
            variant: Option<Shaped>,
        }
        #[derive(Serialize)]
        enum Shaped {
            Holds(HashMap<String, u8>),
        }
        let build = |reverse: bool| {
            let mut keys: Vec<u64> = (0..40).collect();
            if reverse {
                keys.reverse();
            }
            let inner = |k: u64| {
                let entries: Vec<(String, Vec<u8>)> = (0..20)
                    .map(|i| (format!("{k}-{i}"), vec![i as u8]))
                    .collect();
                let (f, b) = maps(&entries);
                if reverse { b } else { f }
            };
            let ints: Vec<(i32, bool)> = (-30..30).map(|i| (i, i % 2 == 0)).collect();
            let (f, b) = maps(&ints);
            let texts: Vec<(String, u8)> = (0..30).map(|i| (i.to_string(), i)).collect();
            let (tf, tb) = maps(&texts);
            Nested {
                outer: keys.iter().map(|&k| (k, inner(k))).collect(),
                list: if reverse {
                    vec![b.clone(), b]
                } else {
                    vec![f.clone(), f]
                },
                variant: Some(Shaped::Holds(if reverse { tb } else { tf })),
            }
        };
        let (a, b) = (build(false), build(true));
        assert_ne!(
            rmp_serde::to_vec_named(&a).unwrap(),
            rmp_serde::to_vec_named(&b).unwrap(),
            "the maps iterate in different orders"
        );
        assert_eq!(to_vec(&a).unwrap(), to_vec(&b).unwrap());
        // The canonical bytes decode to the same value.
        let decoded: HashMap<u64, HashMap<String, Vec<u8>>> = {
            #[derive(serde::Deserialize)]
            struct Outer {
                outer: HashMap<u64, HashMap<String, Vec<u8>>>,
            }
            rmp_serde::from_slice::<Outer>(&to_vec(&a).unwrap())
                .unwrap()
                .outer
        };
        assert_eq!(decoded, a.outer);
    }

    #[test]
    fn hash_sets_are_sorted_and_other_sequences_keep_their_order() {
        let words: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
        let a: HashSet<String> = words.iter().cloned().collect();
        let b: HashSet<String> = words.iter().rev().cloned().collect();
        assert_ne!(
            rmp_serde::to_vec_named(&a).unwrap(),
            rmp_serde::to_vec_named(&b).unwrap(),
            "the sets iterate in different orders"
        );
        assert_eq!(to_vec(&a).unwrap(), to_vec(&b).unwrap());
        // Sorted by encoded bytes, as a BTreeSet of the encodings would be.
        let sorted: BTreeSet<Vec<u8>> = words
            .iter()
            .map(|w| rmp_serde::to_vec(w).unwrap())
            .collect();
        let mut expected = Vec::new();
        write_array_len(&mut expected, 100).unwrap();
        for word in sorted {
            expected.extend(word);
        }
        assert_eq!(to_vec(&a).unwrap(), expected);
        // Sets inside maps inside sets' neighbours.
        let nested_a: HashMap<u8, HashSet<u16>> = (0..10).map(|k| (k, (0..50).collect())).collect();
        let nested_b: HashMap<u8, HashSet<u16>> = (0..10)
            .rev()
            .map(|k| (k, (0..50).rev().collect()))
            .collect();
        assert_eq!(to_vec(&nested_a).unwrap(), to_vec(&nested_b).unwrap());

        // A Vec's order is its meaning.
        assert_ne!(
            to_vec(&vec![1u8, 2]).unwrap(),
            to_vec(&vec![2u8, 1]).unwrap()
        );
        let ordered: BTreeSet<u32> = (0..10).collect();
        assert_eq!(
            to_vec(&ordered).unwrap(),
            rmp_serde::to_vec_named(&ordered).unwrap()
        );
    }

    #[test]
    fn nesting_is_bounded() {
        let mut deep = nest(MAX_DEPTH + 1);
        assert!(matches!(to_vec(&deep), Err(Error::DepthLimitExceeded)));
        deep = nest(100);
        assert_eq!(
            to_vec(&deep).unwrap(),
            rmp_serde::to_vec_named(&deep).unwrap()
        );
    }

    /// `depth` nested single-element lists.
    fn nest(depth: usize) -> Nest {
        let mut nest = Nest(Vec::new());
        for _ in 1..depth {
            nest = Nest(vec![nest]);
        }
        nest
    }

    #[derive(Serialize)]
    struct Nest(Vec<Nest>);
}
