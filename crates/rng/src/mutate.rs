//! Byte-level mutations of a valid input, for the parsers' fuzz tests (a seeded, bounded
//! stand-in for cargo-fuzz that runs in the ordinary test suite): flip, insert, delete,
//! duplicate or truncate bytes, splice in boundary numbers and JSON/tokens that parsers trip on.
//! Example: `let mut m = Mutator::new(7); let bad = m.mutate(b"{\"a\": 1}");`.

use crate::SplitMix64;

/// Text that often breaks parsers: huge and negative numbers, odd JSON values, NUL, UTF-8
/// fragments.
const SPLICES: &[&[u8]] = &[
    b"18446744073709551615",
    b"-1",
    b"1e308",
    b"NaN",
    b"0",
    b"null",
    b"[]",
    b"{}",
    b"\"\"",
    b"\x00",
    b"\xff\xfe",
    b"\xe2\x82",
    b"4294967295",
    b"true",
];

pub struct Mutator {
    rng: SplitMix64,
}

impl Mutator {
    pub fn new(seed: u64) -> Mutator {
        Mutator {
            rng: SplitMix64::new(seed),
        }
    }

    fn below(&mut self, n: usize) -> usize {
        self.rng.next_below(n.max(1) as u64) as usize
    }

    /// `input` with one to four mutations applied.
    pub fn mutate(&mut self, input: &[u8]) -> Vec<u8> {
        let mut b = input.to_vec();
        for _ in 0..1 + self.below(4) {
            let at = self.below(b.len() + 1);
            match self.below(7) {
                0 if !b.is_empty() => {
                    let i = self.below(b.len());
                    b[i] ^= 1 << self.below(8);
                }
                1 => {
                    let byte = self.rng.next_u64() as u8;
                    b.insert(at, byte);
                }
                2 if !b.is_empty() => {
                    let i = self.below(b.len());
                    let n = 1 + self.below(16.min(b.len() - i));
                    b.drain(i..i + n);
                }
                3 if !b.is_empty() => {
                    let i = self.below(b.len());
                    let n = 1 + self.below(64.min(b.len() - i));
                    let piece = b[i..i + n].to_vec();
                    b.splice(at..at, piece);
                }
                4 => b.truncate(at),
                5 => {
                    let s = SPLICES[self.below(SPLICES.len())];
                    // Over a number when there is one here, else inserted.
                    let end = (at..b.len())
                        .find(|&j| !b[j].is_ascii_digit())
                        .unwrap_or(b.len());
                    b.splice(at..end, s.iter().copied());
                }
                _ if b.len() >= 8 => {
                    // A little-endian length or count set to an extreme.
                    let i = self.below(b.len() - 7);
                    let v = [u64::MAX, u32::MAX as u64, 1 << 40, 0][self.below(4)];
                    b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                }
                _ => {}
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_seeded_and_change_the_input() {
        let input = br#"{"hidden_size": 768, "num_hidden_layers": 12}"#;
        let a: Vec<Vec<u8>> = (0..50)
            .map({
                let mut m = Mutator::new(3);
                move |_| m.mutate(input)
            })
            .collect();
        let b: Vec<Vec<u8>> = (0..50)
            .map({
                let mut m = Mutator::new(3);
                move |_| m.mutate(input)
            })
            .collect();
        assert_eq!(a, b);
        assert!(a.iter().filter(|x| x.as_slice() != input).count() > 40);
    }
}
