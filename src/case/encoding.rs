//! How tensor values survive JSON in a corpus file: bytes as hex, f32 as the shortest
//! number that reads back to the same bits, or a string for the rest (`inf`, `-inf`,
//! `nan`, `0x...` bit patterns).

use serde::{Deserialize, Serialize};

/// An f32 that survives JSON: finite values as numbers, the rest as strings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct F32Json(pub(crate) f32);

impl Serialize for F32Json {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        if v.is_finite() {
            s.serialize_f32(v)
        } else if v == f32::INFINITY {
            s.serialize_str("inf")
        } else if v == f32::NEG_INFINITY {
            s.serialize_str("-inf")
        } else {
            s.serialize_str(&format!("{:#010x}", v.to_bits()))
        }
    }
}

impl<'de> Deserialize<'de> for F32Json {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Num(f64),
            Str(String),
        }
        match Repr::deserialize(d)? {
            Repr::Num(x) => Ok(F32Json(x as f32)),
            Repr::Str(s) => match s.to_ascii_lowercase().as_str() {
                "inf" | "+inf" | "infinity" => Ok(F32Json(f32::INFINITY)),
                "-inf" | "-infinity" => Ok(F32Json(f32::NEG_INFINITY)),
                "nan" => Ok(F32Json(f32::NAN)),
                h if h.starts_with("0x") => u32::from_str_radix(&h[2..], 16)
                    .map(|b| F32Json(f32::from_bits(b)))
                    .map_err(|_| serde::de::Error::custom(format!("bad f32 bit pattern {s:?}"))),
                _ => Err(serde::de::Error::custom(format!(
                    "expected a number, \"nan\", \"inf\", \"-inf\" or \"0x...\" bits, got {s:?}"
                ))),
            },
        }
    }
}

pub(crate) fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

pub(crate) fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return Err(format!("hex string has odd length {}", s.len()));
    }
    let nib = |c: u8| -> Result<u8, String> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(format!("invalid hex character {:?}", c as char)),
        }
    };
    s.chunks(2)
        .map(|p| Ok(nib(p[0])? << 4 | nib(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(bits: u32) -> u32 {
        let text = serde_json::to_string(&F32Json(f32::from_bits(bits))).unwrap();
        serde_json::from_str::<F32Json>(&text).unwrap().0.to_bits()
    }

    /// Finite f32s travel as JSON numbers (shortest repr, parsed via f64) and the rest as
    /// strings: every bit pattern must come back unchanged, including subnormals and NaN
    /// payloads. Walks a stride through all 2^32 patterns plus the edges of each binade.
    #[test]
    fn f32_json_round_trips_bit_exactly() {
        let mut bits: u32 = 0;
        loop {
            assert_eq!(round_trip(bits), bits, "{bits:#010x}");
            let (next, overflow) = bits.overflowing_add(65_521); // prime stride
            if overflow {
                break;
            }
            bits = next;
        }
        for e in 0..=255u32 {
            for m in [0u32, 1, 2, 0x3F_FFFF, 0x40_0000, 0x7F_FFFE, 0x7F_FFFF] {
                for s in [0u32, 1 << 31] {
                    let b = s | e << 23 | m;
                    assert_eq!(round_trip(b), b, "{b:#010x}");
                }
            }
        }
    }

    #[test]
    fn f32_json_accepts_the_documented_strings() {
        let p = |s: &str| serde_json::from_str::<F32Json>(s).map(|x| x.0);
        assert_eq!(p("\"inf\"").unwrap(), f32::INFINITY);
        assert_eq!(p("\"-inf\"").unwrap(), f32::NEG_INFINITY);
        assert!(p("\"nan\"").unwrap().is_nan());
        assert_eq!(p("\"0x7fc00001\"").unwrap().to_bits(), 0x7FC0_0001);
        assert_eq!(p("1.5").unwrap(), 1.5);
        assert!(p("\"one\"").is_err());
        assert!(p("\"0xZZ\"").is_err());
    }

    #[test]
    fn hex_codec() {
        assert_eq!(to_hex(&[0x00, 0x7f, 0x80, 0xff]), "007f80ff");
        assert_eq!(from_hex("007F80ff").unwrap(), vec![0x00, 0x7f, 0x80, 0xff]);
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
    }
}
