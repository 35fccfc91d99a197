//! A small, seeded, portable generator (SplitMix64): the same seed gives the same sequence on
//! every machine and build, which is all the fuzzer needs to be reproducible.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The seed of an independent stream `stream` of `seed` (workers, children).
    pub fn derive(seed: u64, stream: u64) -> u64 {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        r.next_u64()
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// Uniform in `0..n` as usize.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }

    /// An index below `n` for which `keep` holds, at random (one draw, as `pick` on the list of
    /// such indices).
    pub fn pick_index(&mut self, n: usize, keep: impl Fn(usize) -> bool) -> Option<usize> {
        let kept: Vec<usize> = (0..n).filter(|&i| keep(i)).collect();
        self.pick(&kept).copied()
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            Some(&items[self.index(items.len())])
        }
    }

    /// Index chosen by weight; `weights` must not be all zero.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut x = self.below(total);
        for (i, &w) in weights.iter().enumerate() {
            if x < u64::from(w) {
                return i;
            }
            x -= u64::from(w);
        }
        weights.len() - 1
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// A value from the edges of the u64 range or a random one.
    pub fn edge_u64(&mut self) -> u64 {
        const EDGES: [u64; 14] = [
            0,
            1,
            4095,
            4096,
            65535,
            65536,
            1 << 40,
            (1 << 40) + 1,
            1 << 51,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX - 4095,
            u64::MAX - 1,
            u64::MAX,
        ];
        if self.chance(500) {
            EDGES[self.index(EDGES.len())]
        } else {
            self.next_u64() >> self.below(64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn same_seed_same_sequence_and_streams_differ() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(Rng::derive(42, 0), Rng::derive(42, 1));
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            assert!(r.range(3, 5) >= 3 && r.range(3, 5) <= 5);
            assert_eq!(r.weighted(&[0, 5, 0]), 1);
        }
    }
}
