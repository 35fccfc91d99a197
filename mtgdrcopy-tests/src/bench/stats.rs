//! Statistics over timed samples: upstream's bucketed P0/P50 and a histogram whose bins are
//! what their labels say.
//!
//! Upstream copylat splits the iterations of one size into up to 100 buckets, times each bucket
//! as a whole and keeps the mean per copy of every bucket; sorting those gives P0 (index 0) and
//! P50 (index n/2). Upstream apiperf's histogram labels bin j as `min*(j+1)..min*(j+2)`, uses an
//! integer bin width and can index an 11th bin with the maximum sample; [`histogram`] does none
//! of that.

pub use super::result::HistogramBin;

/// Upstream's bucket count.
pub const MAX_BUCKETS: u64 = 100;

/// How a number of timed iterations is split into buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    /// Iterations actually run: the requested count, raised to a multiple of [`MAX_BUCKETS`]
    /// when it is larger than that and not a multiple (as upstream does).
    pub iterations: u64,
    /// `min(iterations, 100)`.
    pub buckets: u64,
    /// Iterations timed together in one bucket.
    pub per_bucket: u64,
}

impl BucketPlan {
    /// The plan for `requested` iterations (at least 1; 0 is treated as 1).
    pub fn new(requested: u64) -> BucketPlan {
        let requested = requested.max(1);
        let iterations = if requested > MAX_BUCKETS && requested % MAX_BUCKETS != 0 {
            requested.div_ceil(MAX_BUCKETS) * MAX_BUCKETS
        } else {
            requested
        };
        let buckets = iterations.min(MAX_BUCKETS);
        BucketPlan {
            iterations,
            buckets,
            per_bucket: iterations / buckets,
        }
    }

    /// Whether the requested count had to be raised (callers print a warning).
    pub fn raised(&self, requested: u64) -> bool {
        self.iterations != requested.max(1)
    }
}

/// Order statistics of a set of samples (µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    /// P0.
    pub min: f64,
    /// P50: the sample at index `count / 2` of the sorted samples (upstream's rule; for an even
    /// count that is the upper of the two middle samples).
    pub median: f64,
    pub max: f64,
}

/// The summary of `samples`, or `None` when there are none. NaNs sort last.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(Summary {
        count: sorted.len(),
        mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        min: sorted[0],
        median: sorted[sorted.len() / 2],
        max: sorted[sorted.len() - 1],
    })
}

/// `bins` equal-width bins spanning `[min, max]` of `samples`. Every sample lands in exactly
/// one bin, the maximum in the last. All samples equal gives one bin of zero width; no samples
/// (or `bins == 0`) gives no bins. Non-finite samples are ignored.
pub fn histogram(samples: &[f64], bins: usize) -> Vec<HistogramBin> {
    let finite: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    let Some(s) = summarize(&finite) else {
        return Vec::new();
    };
    if bins == 0 {
        return Vec::new();
    }
    let (lo, hi) = (s.min, s.max);
    if hi == lo {
        return vec![HistogramBin {
            low_us: lo,
            high_us: hi,
            count: finite.len() as u64,
        }];
    }
    let width = (hi - lo) / bins as f64;
    // Edges computed once, so that the bin a sample lands in is decided by the same numbers
    // that are printed as its labels.
    let edge = |i: usize| if i == bins { hi } else { lo + width * i as f64 };
    let mut out: Vec<HistogramBin> = (0..bins)
        .map(|i| HistogramBin {
            low_us: edge(i),
            high_us: edge(i + 1),
            count: 0,
        })
        .collect();
    for &x in &finite {
        let mut i = (((x - lo) / width) as usize).min(bins - 1);
        // Floating-point division can land one bin off near an edge; settle on the edges.
        while i > 0 && x < out[i].low_us {
            i -= 1;
        }
        while i + 1 < bins && x >= out[i + 1].low_us {
            i += 1;
        }
        out[i].count += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_plans_follow_upstream() {
        let p = |n| {
            let b = BucketPlan::new(n);
            (b.iterations, b.buckets, b.per_bucket)
        };
        assert_eq!(p(0), (1, 1, 1));
        assert_eq!(p(1), (1, 1, 1));
        assert_eq!(p(50), (50, 50, 1));
        assert_eq!(p(100), (100, 100, 1));
        assert_eq!(p(101), (200, 100, 2));
        assert_eq!(p(150), (200, 100, 2));
        assert_eq!(p(10_000), (10_000, 100, 100));
        assert!(BucketPlan::new(150).raised(150));
        assert!(!BucketPlan::new(200).raised(200));
        assert!(!BucketPlan::new(7).raised(7));
    }

    #[test]
    fn summary_uses_index_n_over_2_as_median() {
        assert_eq!(summarize(&[]), None);
        let one = summarize(&[3.0]).unwrap();
        assert_eq!(
            (one.min, one.median, one.max, one.mean),
            (3.0, 3.0, 3.0, 3.0)
        );
        let odd = summarize(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((odd.min, odd.median, odd.max), (1.0, 3.0, 5.0));
        assert_eq!(odd.mean, 3.0);
        let even = summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((even.min, even.median, even.max), (1.0, 3.0, 4.0));
        assert_eq!(even.count, 4);
    }

    #[test]
    fn histogram_edge_cases() {
        assert!(histogram(&[], 10).is_empty());
        assert!(histogram(&[1.0, 2.0], 0).is_empty());
        let same = histogram(&[2.5, 2.5, 2.5], 10);
        assert_eq!(
            same,
            vec![HistogramBin {
                low_us: 2.5,
                high_us: 2.5,
                count: 3
            }]
        );
        let single = histogram(&[7.0], 10);
        assert_eq!(single.len(), 1);
        assert_eq!(single[0].count, 1);
        assert!(histogram(&[f64::NAN], 10).is_empty());
    }

    #[test]
    fn histogram_bins_are_contiguous_and_hold_every_sample() {
        // Upstream would put the maximum in an 11th bin and label bins from min*(j+1).
        let samples: Vec<f64> = (0..=100).map(|i| 10.0 + i as f64 * 0.37).collect();
        let h = histogram(&samples, 10);
        assert_eq!(h.len(), 10);
        assert_eq!(h.iter().map(|b| b.count).sum::<u64>(), samples.len() as u64);
        assert_eq!(h[0].low_us, 10.0);
        assert_eq!(h[9].high_us, 47.0);
        for w in h.windows(2) {
            assert_eq!(w[0].high_us, w[1].low_us);
        }
        // Every sample is inside the edges of the bin it was counted in.
        for &x in &samples {
            let i = h
                .iter()
                .position(|b| x >= b.low_us && (x < b.high_us || b.high_us == 47.0))
                .unwrap();
            assert!(h[i].count > 0);
        }
    }

    #[test]
    fn histogram_puts_edge_samples_in_the_upper_bin_and_max_in_the_last() {
        // Range 0..10 in 10 bins: width 1, so 3.0 starts bin 3 and 10.0 closes bin 9.
        let h = histogram(&[0.0, 3.0, 10.0], 10);
        let counts: Vec<u64> = h.iter().map(|b| b.count).collect();
        assert_eq!(counts, vec![1, 0, 0, 1, 0, 0, 0, 0, 0, 1]);
        // One outlier: everything else in the first bin, as in upstream's published sample.
        let mut s = vec![1000.0; 98];
        s.extend([13_000.0, 14_000.0]);
        let h = histogram(&s, 10);
        assert_eq!(h[0].count, 98);
        assert_eq!(h[9].count, 2, "{h:?}");
        assert_eq!(h.iter().map(|b| b.count).sum::<u64>(), 100);
    }
}
