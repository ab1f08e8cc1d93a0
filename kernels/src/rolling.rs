//! Rolling time-window aggregations (sum, mean, min, max, count, std, var)
//! over one group sorted by its order column, all computed in one pass.
//!
//! For a row with order value `t` and window `w >= 0` the window holds the
//! rows `j` with `t - w < ts[j] <= t` ([`Closed::Right`], the default;
//! `t - w` is calendar arithmetic for a [`Window::Calendar`], on a time
//! zone's local clock for a [`Window::Zoned`]); the
//! other [`Closed`] modes make either bound inclusive or exclusive. Rows with
//! equal `ts` share one window. Nulls are skipped; std/var are sample
//! statistics (ddof = 1), as in DuckDB and Polars.
//!
//! Cost: one pass, O(n) amortised for all requested aggregations together,
//! computed once per run of equal `ts`. Two monotone pointers bound the
//! window; the window's aggregate (count, compensated sum, shifted Welford
//! mean/M2, min, max) lives in a two-stacks sliding aggregate: values are
//! only merged, never subtracted, so nothing drifts and the result matches a
//! two-pass computation to rounding. Memory: O(window) scratch plus output.
//! A calendar window's start can step back (at a clamped month end, or a
//! change of a zone's offset, see
//! [`crate::window`]): by at most the rows of one day of its target, each
//! prepended to the two-stacks front with one push, so the pass stays
//! O(n + steps back) and a fixed window's loop has no such step at all.

use std::fmt;
use std::str::FromStr;

pub use crate::window::{CalendarUnit, Window};

/// Which ends of the window `[t - w, t]` are included (default: right).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Closed {
    /// `t - w < ts <= t` (the default).
    #[default]
    Right,
    /// `t - w <= ts <= t`.
    Both,
    /// `t - w <= ts < t`.
    Left,
    /// `t - w < ts < t`.
    None,
}

impl Closed {
    /// The name `FromStr` accepts: "right", "both", "left" or "none".
    pub const fn name(self) -> &'static str {
        match self {
            Closed::Right => "right",
            Closed::Both => "both",
            Closed::Left => "left",
            Closed::None => "none",
        }
    }

    const fn lower_inclusive(self) -> bool {
        matches!(self, Closed::Both | Closed::Left)
    }

    const fn upper_inclusive(self) -> bool {
        matches!(self, Closed::Right | Closed::Both)
    }
}

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Closed {
    type Err = RollingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Closed::Right, Closed::Both, Closed::Left, Closed::None]
            .into_iter()
            .find(|c| s.eq_ignore_ascii_case(c.name()))
            .ok_or_else(|| RollingError::UnknownClosed(s.to_owned()))
    }
}

/// A rolling aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Agg {
    /// Sum of the non-null values; null for an empty window.
    Sum,
    /// Mean of the non-null values; null for an empty window.
    Mean,
    /// Minimum (a NaN loses against a number); null for an empty window.
    Min,
    /// Maximum (a NaN loses against a number); null for an empty window.
    Max,
    /// Number of non-null values; never null.
    Count,
    /// Sample standard deviation (ddof = 1); null below two values.
    Std,
    /// Sample variance (ddof = 1); null below two values.
    Var,
}

impl Agg {
    /// Every aggregation, in declaration order.
    pub const ALL: [Agg; 7] = [
        Agg::Sum,
        Agg::Mean,
        Agg::Min,
        Agg::Max,
        Agg::Count,
        Agg::Std,
        Agg::Var,
    ];

    /// Lower-case name: "sum", "mean", "min", "max", "count", "std", "var".
    pub const fn name(self) -> &'static str {
        match self {
            Agg::Sum => "sum",
            Agg::Mean => "mean",
            Agg::Min => "min",
            Agg::Max => "max",
            Agg::Count => "count",
            Agg::Std => "std",
            Agg::Var => "var",
        }
    }
}

impl fmt::Display for Agg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Agg {
    type Err = RollingError;

    /// Accepts [`Agg::name`] and the SQL spellings "avg", "stddev",
    /// "stddev_samp", "variance", "var_samp" (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const ALIASES: [(&str, Agg); 5] = [
            ("avg", Agg::Mean),
            ("stddev", Agg::Std),
            ("stddev_samp", Agg::Std),
            ("variance", Agg::Var),
            ("var_samp", Agg::Var),
        ];
        Agg::ALL
            .into_iter()
            .map(|a| (a.name(), a))
            .chain(ALIASES)
            .find(|(n, _)| s.eq_ignore_ascii_case(n))
            .map(|(_, a)| a)
            .ok_or_else(|| RollingError::UnknownAgg(s.to_owned()))
    }
}

/// Bad input to a rolling kernel, or an unknown name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RollingError {
    /// The window length is negative.
    #[error("rolling window must be >= 0, got {0}")]
    NegativeWindow(i64),
    /// A window on a zone's local clock over a column of days (a date has
    /// no time zone).
    #[error("a window on the local clock of time zone {0} needs a timestamp column, not days")]
    ZonedDays(crate::window::Zone),
    /// An input column's length differs from the order column's.
    #[error("{what} has {got} rows, expected {expected}")]
    LengthMismatch {
        /// Which input.
        what: &'static str,
        /// Rows in the order column.
        expected: usize,
        /// Rows in this input.
        got: usize,
    },
    /// `emit_from` is past the last row.
    #[error("emit_from {emit_from} is past the end ({len} rows)")]
    EmitFromOutOfRange {
        /// The requested first output row.
        emit_from: usize,
        /// Rows in the input.
        len: usize,
    },
    /// The order column decreases at `row` (`ts[row] < ts[row - 1]`).
    #[error("order column is not sorted ascending at row {row}")]
    Unsorted {
        /// First offending row.
        row: usize,
    },
    /// Segment offsets are not `0 = o[0] <= o[1] <= ... <= o[last] = n`.
    #[error("invalid segment offsets: {0}")]
    BadOffsets(&'static str),
    /// Unknown aggregation name.
    #[error("unknown rolling aggregation {0:?} (sum, mean, min, max, count, std, var)")]
    UnknownAgg(String),
    /// Unknown window closure name.
    #[error("unknown window closure {0:?} (expected right, both, left or none)")]
    UnknownClosed(String),
}

/// One output column: the aggregation and its value per output row.
#[derive(Debug, Clone, PartialEq)]
pub struct AggColumn {
    /// The aggregation this column holds.
    pub agg: Agg,
    /// Value per output row; unspecified (0.0) where `valid` is false. For
    /// [`Agg::Count`] the count as `f64` (exact below 2^53).
    pub values: Vec<f64>,
    /// Validity per output row (false = null).
    pub valid: Vec<bool>,
}

impl AggColumn {
    fn new(agg: Agg, len: usize) -> Self {
        AggColumn {
            agg,
            values: vec![0.0; len],
            valid: vec![false; len],
        }
    }

    /// Number of output rows.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no output rows.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Value at output row `i`, `None` when null or out of range.
    pub fn get(&self, i: usize) -> Option<f64> {
        match self.valid.get(i) {
            Some(true) => self.values.get(i).copied(),
            _ => None,
        }
    }

    /// The counts as integers, for an [`Agg::Count`] column; `None` otherwise.
    pub fn counts(&self) -> Option<Vec<i64>> {
        (self.agg == Agg::Count).then(|| self.values.iter().map(|&c| c as i64).collect())
    }
}

/// The result of a rolling kernel: one column per requested aggregation, in
/// the order requested.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RollingResult {
    /// Output columns, in the order of the `aggs` argument.
    pub columns: Vec<AggColumn>,
}

impl RollingResult {
    /// The first column holding `agg`.
    pub fn column(&self, agg: Agg) -> Option<&AggColumn> {
        self.columns.iter().find(|c| c.agg == agg)
    }
}

/// Rolling aggregations over one group sorted by `ts`.
///
/// `values[j]` is null where `valid` is given and `valid[j]` is false. Rows
/// `0..emit_from` are lookback ("ghost") rows: they fall inside windows but
/// get no output. The result has `ts.len() - emit_from` rows per column, one
/// column per entry of `aggs` in that order. See the module docs for the
/// window.
///
/// Errors on a negative window, mismatched lengths, `emit_from > ts.len()`
/// or a decreasing `ts`.
pub fn rolling(
    ts: &[i64],
    values: &[f64],
    valid: Option<&[bool]>,
    window: impl Into<Window>,
    closed: Closed,
    aggs: &[Agg],
    emit_from: usize,
) -> Result<RollingResult, RollingError> {
    let n = ts.len();
    let window = window.into();
    check_inputs(ts, values, valid, window)?;
    if emit_from > n {
        return Err(RollingError::EmitFromOutOfRange { emit_from, len: n });
    }
    check_sorted(ts, 0)?;
    let input = Input {
        ts,
        values,
        valid,
        window,
        closed,
    };
    Ok(run_dispatch(&input, &[0, n], emit_from, aggs))
}

/// The groups of a [`rolling_segments`] call, and its lookback rows.
///
/// `offsets` delimit the groups: group `g` is rows `offsets[g]..offsets[g+1]`;
/// they must start at 0, end at the row count and not decrease. Rows
/// `0..emit_from` are lookback ("ghost") rows, as in [`rolling`]: they fall
/// inside the windows of their group's later rows but get no output (a
/// chunk of a group whose earlier rows another chunk outputs).
#[derive(Debug, Clone, Copy)]
pub struct Segments<'a> {
    /// Where each group starts, and the row count last.
    pub offsets: &'a [usize],
    /// Rows that only feed windows.
    pub emit_from: usize,
}

impl<'a> Segments<'a> {
    /// Groups at `offsets`, every row output.
    pub fn new(offsets: &'a [usize]) -> Self {
        Segments {
            offsets,
            emit_from: 0,
        }
    }
}

/// Rolling aggregations over several groups in one call.
///
/// Each group is sorted by `ts` on its own; windows never cross a group
/// boundary. The result has `ts.len() - emit_from` rows per column.
pub fn rolling_segments(
    ts: &[i64],
    values: &[f64],
    valid: Option<&[bool]>,
    segments: Segments<'_>,
    window: impl Into<Window>,
    closed: Closed,
    aggs: &[Agg],
) -> Result<RollingResult, RollingError> {
    let n = ts.len();
    let window = window.into();
    let Segments { offsets, emit_from } = segments;
    check_inputs(ts, values, valid, window)?;
    match (offsets.first(), offsets.last()) {
        (Some(0), Some(&last)) if last == n => {}
        _ => {
            return Err(RollingError::BadOffsets(
                "must start at 0 and end at the row count",
            ));
        }
    }
    if offsets.windows(2).any(|seg| seg[0] > seg[1]) {
        return Err(RollingError::BadOffsets("offsets decrease"));
    }
    if emit_from > n {
        return Err(RollingError::EmitFromOutOfRange { emit_from, len: n });
    }
    for seg in offsets.windows(2) {
        check_sorted(&ts[seg[0]..seg[1]], seg[0])?;
    }
    let input = Input {
        ts,
        values,
        valid,
        window,
        closed,
    };
    Ok(run_dispatch(&input, offsets, emit_from, aggs))
}

fn check_inputs(
    ts: &[i64],
    values: &[f64],
    valid: Option<&[bool]>,
    window: Window,
) -> Result<(), RollingError> {
    if window.length() < 0 {
        return Err(RollingError::NegativeWindow(window.length()));
    }
    if let Window::Zoned {
        unit: CalendarUnit::Days,
        zone,
        ..
    } = window
    {
        return Err(RollingError::ZonedDays(zone));
    }
    let n = ts.len();
    if values.len() != n {
        return Err(RollingError::LengthMismatch {
            what: "values",
            expected: n,
            got: values.len(),
        });
    }
    match valid {
        Some(v) if v.len() != n => Err(RollingError::LengthMismatch {
            what: "valid",
            expected: n,
            got: v.len(),
        }),
        _ => Ok(()),
    }
}

fn check_sorted(ts: &[i64], base: usize) -> Result<(), RollingError> {
    match ts.windows(2).position(|w| w[1] < w[0]) {
        Some(p) => Err(RollingError::Unsorted { row: base + p + 1 }),
        None => Ok(()),
    }
}

struct Input<'a> {
    ts: &'a [i64],
    values: &'a [f64],
    valid: Option<&'a [bool]>,
    window: Window,
    closed: Closed,
}

#[inline(always)]
fn is_valid(valid: Option<&[bool]>, j: usize) -> bool {
    valid.is_none_or(|v| v[j])
}

/// Error-free transformation: `a + b = s + e` exactly (Knuth's TwoSum).
#[inline(always)]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bp = s - a;
    let e = (a - (s - bp)) + (b - bp);
    (s, e)
}

/// Count / sum / mean / M2 of the non-null values in a window: a
/// commutative monoid, merged by the two-stacks aggregate.
trait Moments: Copy {
    /// Tracks M2 (sample variance); false lets the variance code vanish.
    const HAS_M2: bool;
    const EMPTY: Self;
    fn push(&mut self, x: f64);
    fn merge(&self, other: &Self) -> Self;
    fn count(&self) -> u64;
    fn sum(&self) -> f64;
    fn m2(&self) -> f64;
}

/// Count only (count, min, max).
#[derive(Clone, Copy)]
struct CountM {
    n: u64,
}

impl Moments for CountM {
    const HAS_M2: bool = false;
    const EMPTY: Self = CountM { n: 0 };
    #[inline(always)]
    fn push(&mut self, _: f64) {
        self.n += 1;
    }
    #[inline(always)]
    fn merge(&self, o: &Self) -> Self {
        CountM { n: self.n + o.n }
    }
    #[inline(always)]
    fn count(&self) -> u64 {
        self.n
    }
    #[inline(always)]
    fn sum(&self) -> f64 {
        0.0
    }
    #[inline(always)]
    fn m2(&self) -> f64 {
        0.0
    }
}

/// Count and a compensated sum `s + c`.
#[derive(Clone, Copy)]
struct SumM {
    n: u64,
    s: f64,
    c: f64,
}

#[inline(always)]
fn finish_sum(s: f64, c: f64) -> f64 {
    // With an infinity or NaN in the window the compensation is NaN.
    if s.is_finite() { s + c } else { s }
}

impl Moments for SumM {
    const HAS_M2: bool = false;
    const EMPTY: Self = SumM {
        n: 0,
        s: 0.0,
        c: 0.0,
    };
    #[inline(always)]
    fn push(&mut self, x: f64) {
        self.n += 1;
        let (s, e) = two_sum(self.s, x);
        self.s = s;
        self.c += e;
    }
    #[inline(always)]
    fn merge(&self, o: &Self) -> Self {
        let (s, e) = two_sum(self.s, o.s);
        SumM {
            n: self.n + o.n,
            s,
            c: self.c + o.c + e,
        }
    }
    #[inline(always)]
    fn count(&self) -> u64 {
        self.n
    }
    #[inline(always)]
    fn sum(&self) -> f64 {
        finish_sum(self.s, self.c)
    }
    #[inline(always)]
    fn m2(&self) -> f64 {
        0.0
    }
}

/// Count, compensated sum, and Welford mean / M2 (sum of squared
/// deviations), merged with Chan et al.'s pairwise update. The mean is
/// held as `k + mean`, `k` being the first value the aggregate saw, so that
/// its rounding follows the spread of the data rather than its magnitude
/// (1e9 + noise keeps full precision).
#[derive(Clone, Copy)]
struct VarM {
    n: u64,
    s: f64,
    c: f64,
    k: f64,
    mean: f64,
    m2: f64,
}

impl Moments for VarM {
    const HAS_M2: bool = true;
    const EMPTY: Self = VarM {
        n: 0,
        s: 0.0,
        c: 0.0,
        k: 0.0,
        mean: 0.0,
        m2: 0.0,
    };
    #[inline(always)]
    fn push(&mut self, x: f64) {
        if self.n == 0 {
            self.k = x;
        }
        self.n += 1;
        let (s, e) = two_sum(self.s, x);
        self.s = s;
        self.c += e;
        let y = x - self.k;
        let d = y - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (y - self.mean);
    }
    #[inline(always)]
    fn merge(&self, o: &Self) -> Self {
        if o.n == 0 {
            return *self;
        }
        if self.n == 0 {
            return *o;
        }
        let n = self.n + o.n;
        let nf = n as f64;
        let (na, nb) = (self.n as f64, o.n as f64);
        let (s, e) = two_sum(self.s, o.s);
        // Exact when the two shifts are within a factor 2 (Sterbenz).
        let delta = (o.k - self.k) + (o.mean - self.mean);
        VarM {
            n,
            s,
            c: self.c + o.c + e,
            k: self.k,
            mean: self.mean + delta * (nb / nf),
            // delta * (delta * f), not delta * delta * f: delta^2 can
            // overflow where the term (f is na nb / n, as small as 1/2) does not.
            m2: self.m2 + o.m2 + delta * (delta * (na * nb / nf)),
        }
    }
    #[inline(always)]
    fn count(&self) -> u64 {
        self.n
    }
    #[inline(always)]
    fn sum(&self) -> f64 {
        finish_sum(self.s, self.c)
    }
    #[inline(always)]
    fn m2(&self) -> f64 {
        self.m2
    }
}

/// The whole window aggregate: the moments plus, where wanted, min and max
/// (IEEE minNum / maxNum: a NaN loses against a number, so it is the result
/// only when the window holds nothing else). Min and max are idempotent and
/// branch-free to merge, which makes them cheaper here than in monotonic
/// deques, whose pops mispredict on unordered data.
#[derive(Clone, Copy)]
struct State<M, const MIN: bool, const MAX: bool> {
    m: M,
    min: f64,
    max: f64,
}

impl<M: Moments, const MIN: bool, const MAX: bool> State<M, MIN, MAX> {
    const EMPTY: Self = State {
        m: M::EMPTY,
        min: f64::NAN,
        max: f64::NAN,
    };

    #[inline(always)]
    fn push(&mut self, x: f64) {
        self.m.push(x);
        if MIN {
            self.min = self.min.min(x);
        }
        if MAX {
            self.max = self.max.max(x);
        }
    }

    #[inline(always)]
    fn merge(&self, o: &Self) -> Self {
        State {
            m: self.m.merge(&o.m),
            min: if MIN { self.min.min(o.min) } else { f64::NAN },
            max: if MAX { self.max.max(o.max) } else { f64::NAN },
        }
    }
}

/// Two-stacks sliding aggregate over the rows `[lo, added)`: the "front"
/// holds suffix aggregates of `[lo, mid)` (built right to left when the
/// front runs out), the "back" the running aggregate of `[mid, added)`.
/// Every row is pushed once into the back and once into a front rebuild;
/// a query merges two aggregates. Nothing is ever subtracted, so nothing
/// drifts, and infinities / NaNs leave no trace once out of the window.
struct TwoStacks<M, const MIN: bool, const MAX: bool> {
    mid: usize,
    added: usize,
    back: State<M, MIN, MAX>,
    /// `front[k]` aggregates rows `mid - 1 - k .. mid`.
    front: Vec<State<M, MIN, MAX>>,
}

impl<M: Moments, const MIN: bool, const MAX: bool> TwoStacks<M, MIN, MAX> {
    fn new() -> Self {
        TwoStacks {
            mid: 0,
            added: 0,
            back: State::EMPTY,
            front: Vec::new(),
        }
    }

    fn reset(&mut self, at: usize) {
        self.mid = at;
        self.added = at;
        self.back = State::EMPTY;
        self.front.clear();
    }

    /// Moves the window to `[lo, hi)` (`hi` at least its previous value,
    /// `lo <= hi`) and returns its aggregate. `lo` may move back (a
    /// calendar window's start does at a clamped month end): rows below
    /// the front are prepended to it, one push each.
    #[inline(always)]
    fn window(
        &mut self,
        values: &[f64],
        valid: Option<&[bool]>,
        lo: usize,
        hi: usize,
        moves_back: bool,
    ) -> State<M, MIN, MAX> {
        if lo > self.added {
            self.reset(lo);
        }
        for (j, &x) in values.iter().enumerate().take(hi).skip(self.added) {
            if is_valid(valid, j) {
                self.back.push(x);
            }
        }
        self.added = hi;
        if lo >= self.mid {
            // Front exhausted: rebuild it from everything in the window.
            self.front.clear();
            let mut acc = State::EMPTY;
            for j in (lo..hi).rev() {
                if is_valid(valid, j) {
                    acc.push(values[j]);
                }
                self.front.push(acc);
            }
            self.mid = hi;
            self.back = State::EMPTY;
        } else if moves_back && lo < self.mid - self.front.len() {
            // The start moved back past the front: extend it downwards.
            let mut acc = self.front.last().copied().unwrap_or(State::EMPTY);
            for j in (lo..self.mid - self.front.len()).rev() {
                if is_valid(valid, j) {
                    acc.push(values[j]);
                }
                self.front.push(acc);
            }
        }
        if lo < self.mid {
            self.front[self.mid - 1 - lo].merge(&self.back)
        } else {
            self.back
        }
    }
}

/// Each row's `t - w` for the kernel: a subtraction, or the calendar
/// ([`crate::window::LowerCursor`]), whose edges can move back (the start
/// pointer then moves back too; a fixed window's code has no such step).
trait Edge {
    /// Whether a later row's edge can lie below an earlier row's.
    const MOVES_BACK: bool;
    /// `t - w`; `None` below `i64::MIN`.
    fn lower(&mut self, t: i64) -> Option<i64>;
}

/// A fixed window's edge.
struct FixedEdge(i64);

impl Edge for FixedEdge {
    const MOVES_BACK: bool = false;
    #[inline(always)]
    fn lower(&mut self, t: i64) -> Option<i64> {
        t.checked_sub(self.0)
    }
}

impl Edge for crate::window::LowerCursor {
    const MOVES_BACK: bool = true;
    #[inline(always)]
    fn lower(&mut self, t: i64) -> Option<i64> {
        crate::window::LowerCursor::lower(self, t)
    }
}

fn run_dispatch(
    input: &Input<'_>,
    offsets: &[usize],
    emit_from: usize,
    aggs: &[Agg],
) -> RollingResult {
    let out_len = input.ts.len() - emit_from;
    let mut columns: Vec<AggColumn> = aggs.iter().map(|&a| AggColumn::new(a, out_len)).collect();
    if aggs.is_empty() || out_len == 0 {
        return RollingResult { columns };
    }
    let has = |set: &[Agg]| aggs.iter().any(|a| set.contains(a));
    let (min, max) = (has(&[Agg::Min]), has(&[Agg::Max]));
    macro_rules! go {
        ($m:ty, $e:expr) => {
            match (min, max) {
                (false, false) => {
                    run::<$m, false, false, _>(input, offsets, emit_from, &mut columns, $e)
                }
                (true, false) => {
                    run::<$m, true, false, _>(input, offsets, emit_from, &mut columns, $e)
                }
                (false, true) => {
                    run::<$m, false, true, _>(input, offsets, emit_from, &mut columns, $e)
                }
                (true, true) => {
                    run::<$m, true, true, _>(input, offsets, emit_from, &mut columns, $e)
                }
            }
        };
    }
    macro_rules! moments {
        ($e:expr) => {
            if has(&[Agg::Var, Agg::Std]) {
                go!(VarM, $e)
            } else if has(&[Agg::Sum, Agg::Mean]) {
                go!(SumM, $e)
            } else {
                go!(CountM, $e)
            }
        };
    }
    match input.window {
        Window::Fixed(w) => moments!(FixedEdge(w)),
        w => moments!(w.cursor()),
    }
    RollingResult { columns }
}

#[inline(always)]
fn sample_var<M: Moments>(m: &M) -> Option<f64> {
    let n = m.count();
    if !M::HAS_M2 || n < 2 {
        return None;
    }
    let v = m.m2() / (n - 1) as f64;
    // Clamp rounding below zero; keep NaN.
    Some(if v < 0.0 { 0.0 } else { v })
}

/// The kernel proper, monomorphised on the tracked moments and on whether
/// min / max are wanted. Rows before `emit_from` (global index) get no
/// output; output row `r - emit_from` belongs to input row `r`.
fn run<M: Moments, const MIN: bool, const MAX: bool, E: Edge>(
    input: &Input<'_>,
    offsets: &[usize],
    emit_from: usize,
    columns: &mut [AggColumn],
    mut lower: E,
) {
    let Input {
        ts,
        values,
        valid,
        closed,
        ..
    } = *input;
    let lower_incl = i64::from(closed.lower_inclusive());
    let upper_incl = closed.upper_inclusive();
    let mut stacks = TwoStacks::<M, MIN, MAX>::new();

    for seg in offsets.windows(2) {
        let (s, e) = (seg[0], seg[1]);
        if e <= emit_from {
            continue;
        }
        stacks.reset(s);
        let mut i = s;
        let mut lo = s;
        while i < e {
            let t = ts[i];
            let mut re = i + 1;
            while re < e && ts[re] == t {
                re += 1;
            }
            if re > emit_from {
                // Rows with ts <= cut are below the window; None: none are.
                match lower.lower(t).and_then(|b| b.checked_sub(lower_incl)) {
                    Some(cut) => {
                        while lo < e && ts[lo] <= cut {
                            lo += 1;
                        }
                        // A calendar window's start can move back.
                        while E::MOVES_BACK && lo > s && ts[lo - 1] > cut {
                            lo -= 1;
                        }
                    }
                    None => lo = s,
                }
                let hi = if upper_incl { re } else { i };
                let st = stacks.window(values, valid, lo.min(hi), hi, E::MOVES_BACK);
                let count = st.m.count();
                let (a, b) = (i.max(emit_from) - emit_from, re - emit_from);
                for col in columns.iter_mut() {
                    let v = match col.agg {
                        Agg::Count => Some(count as f64),
                        Agg::Sum => (count > 0).then(|| st.m.sum()),
                        Agg::Mean => (count > 0).then(|| st.m.sum() / count as f64),
                        Agg::Min => (count > 0).then_some(st.min),
                        Agg::Max => (count > 0).then_some(st.max),
                        Agg::Var => sample_var(&st.m),
                        Agg::Std => sample_var(&st.m).map(f64::sqrt),
                    };
                    let (v, ok) = match v {
                        Some(v) => (v, true),
                        None => (0.0, false),
                    };
                    if b == a + 1 {
                        col.values[a] = v;
                        col.valid[a] = ok;
                    } else {
                        col.values[a..b].fill(v);
                        col.valid[a..b].fill(ok);
                    }
                }
            }
            i = re;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }
        fn unit(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }
        fn chance(&mut self, p: f64) -> bool {
            self.unit() < p
        }
    }

    #[test]
    fn a_local_clock_window_over_days_is_refused() {
        let w = Window::Zoned {
            months: 1,
            weeks: 0,
            days: 0,
            then: 0,
            unit: CalendarUnit::Days,
            zone: "Europe/Berlin".parse().unwrap(),
        };
        let e = rolling(&[1, 2], &[1.0, 2.0], None, w, Closed::Right, &[Agg::Sum], 0);
        assert!(matches!(e, Err(RollingError::ZonedDays(_))));
    }

    /// Relative 1e-9, absolute 1e-9 near zero.
    const TOL: (f64, f64) = (1e-9, 1.0);
    const CLOSED: [Closed; 4] = [Closed::Right, Closed::Both, Closed::Left, Closed::None];

    fn in_window(tj: i64, t: i64, w: Window, closed: Closed) -> bool {
        let lower = match w {
            Window::Fixed(w) => t as i128 - w as i128,
            _ => w.lower(t).map_or(i128::MIN, i128::from),
        };
        let (tj, t) = (tj as i128, t as i128);
        let lo_ok = match closed {
            Closed::Both | Closed::Left => tj >= lower,
            _ => tj > lower,
        };
        let hi_ok = match closed {
            Closed::Right | Closed::Both => tj <= t,
            _ => tj < t,
        };
        lo_ok && hi_ok
    }

    /// Two-pass statistics of one window: (count, sum, mean, min, max, var).
    fn stats(xs: &[f64]) -> [Option<f64>; 7] {
        let n = xs.len();
        let count = Some(n as f64);
        if n == 0 {
            return [None, None, None, None, count, None, None];
        }
        let sum: f64 = xs.iter().sum();
        let m0 = sum / n as f64;
        // Refined two-pass mean.
        let mean = m0 + xs.iter().map(|x| x - m0).sum::<f64>() / n as f64;
        let min = xs.iter().copied().fold(f64::NAN, f64::min);
        let max = xs.iter().copied().fold(f64::NAN, f64::max);
        let var = (n >= 2).then(|| {
            let d: f64 = xs.iter().map(|x| x - mean).sum();
            let ss: f64 = xs.iter().map(|x| (x - mean) * (x - mean)).sum();
            (ss - d * d / n as f64) / (n - 1) as f64
        });
        // Order of Agg::ALL: sum, mean, min, max, count, std, var.
        [
            Some(sum),
            Some(sum / n as f64),
            Some(min),
            Some(max),
            count,
            var.map(|v| if v < 0.0 { 0.0 } else { v.sqrt() }),
            var,
        ]
    }

    fn agg_index(a: Agg) -> usize {
        Agg::ALL.iter().position(|&b| b == a).unwrap()
    }

    /// O(n^2) reference: per output row, scan every row.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        ts: &[i64],
        values: &[f64],
        valid: Option<&[bool]>,
        w: impl Into<Window>,
        closed: Closed,
        emit_from: usize,
    ) -> Vec<[Option<f64>; 7]> {
        let w = w.into();
        (emit_from..ts.len())
            .map(|i| {
                let xs: Vec<f64> = (0..ts.len())
                    .filter(|&j| in_window(ts[j], ts[i], w, closed))
                    .filter(|&j| valid.is_none_or(|v| v[j]))
                    .map(|j| values[j])
                    .collect();
                stats(&xs)
            })
            .collect()
    }

    /// `|a - b| <= rel * max(|a|, |b|, floor)`; NaN equals NaN.
    fn close(a: f64, b: f64, rel: f64, floor: f64) -> bool {
        if a == b || (a.is_nan() && b.is_nan()) {
            return true;
        }
        (a - b).abs() <= rel * a.abs().max(b.abs()).max(floor)
    }

    fn check(
        got: &RollingResult,
        want: &[[Option<f64>; 7]],
        aggs: &[Agg],
        (rel, floor): (f64, f64),
        ctx: &str,
    ) {
        assert_eq!(got.columns.len(), aggs.len(), "{ctx}");
        for (col, &agg) in got.columns.iter().zip(aggs) {
            assert_eq!(col.agg, agg, "{ctx}");
            assert_eq!(col.len(), want.len(), "{ctx}");
            for (r, w) in want.iter().enumerate() {
                let w = w[agg_index(agg)];
                let g = col.get(r);
                match (g, w) {
                    (None, None) => {}
                    (Some(g), Some(w)) => {
                        if agg == Agg::Count {
                            assert_eq!(g, w, "{ctx} {agg} row {r}");
                        } else {
                            assert!(
                                close(g, w, rel, floor),
                                "{ctx} {agg} row {r}: got {g}, want {w}"
                            );
                        }
                    }
                    _ => panic!("{ctx} {agg} row {r}: got {g:?}, want {w:?}"),
                }
            }
        }
    }

    struct Case {
        ts: Vec<i64>,
        values: Vec<f64>,
        valid: Option<Vec<bool>>,
    }

    fn random_case(rng: &mut Rng, n: usize) -> Case {
        let dup_p = [0.0, 0.3, 0.8, 1.0][rng.below(4) as usize];
        let max_gap = [1, 3, 10, 1000][rng.below(4) as usize];
        let start = match rng.below(4) {
            0 => i64::MIN + rng.below(5) as i64,
            1 => i64::MAX - (n as i64) * 1000 - 10,
            _ => rng.below(2000) as i64 - 1000,
        };
        let mut t = start;
        let ts = (0..n)
            .map(|_| {
                if !rng.chance(dup_p) {
                    t += 1 + rng.below(max_gap) as i64;
                }
                t
            })
            .collect();
        let ints = rng.chance(0.3);
        let values = (0..n)
            .map(|_| {
                if ints {
                    rng.below(7) as f64 - 3.0
                } else {
                    rng.unit() * 200.0 - 100.0
                }
            })
            .collect();
        let null_p = [0.0, 0.0, 0.1, 0.5, 0.9, 1.0][rng.below(6) as usize];
        let valid = (null_p > 0.0).then(|| (0..n).map(|_| !rng.chance(null_p)).collect());
        Case { ts, values, valid }
    }

    fn windows_for(rng: &mut Rng, ts: &[i64]) -> Vec<i64> {
        let span = match (ts.first(), ts.last()) {
            (Some(&a), Some(&b)) => b.saturating_sub(a),
            _ => 0,
        };
        let gap = span / (ts.len() as i64).max(1);
        vec![
            0,
            1,
            1 + rng.below(3 * gap.max(1) as u64) as i64,
            10 * gap.max(1),
            span.saturating_add(1),
            i64::MAX,
        ]
    }

    fn random_aggs(rng: &mut Rng) -> Vec<Agg> {
        if rng.chance(0.3) {
            return Agg::ALL.to_vec();
        }
        let k = 1 + rng.below(4) as usize;
        (0..k).map(|_| Agg::ALL[rng.below(7) as usize]).collect()
    }

    #[test]
    fn matches_brute_force() {
        let mut rng = Rng(42);
        let mut cases = 0;
        for iter in 0..400 {
            let n = match iter % 5 {
                0 => rng.below(4) as usize,
                1 => 1,
                _ => rng.below(200) as usize,
            };
            let c = random_case(&mut rng, n);
            let valid = c.valid.as_deref();
            for w in windows_for(&mut rng, &c.ts) {
                for closed in CLOSED {
                    let aggs = random_aggs(&mut rng);
                    let emit_from = if rng.chance(0.5) {
                        0
                    } else {
                        rng.below(n as u64 + 1) as usize
                    };
                    let got =
                        rolling(&c.ts, &c.values, valid, w, closed, &aggs, emit_from).unwrap();
                    let want = reference(&c.ts, &c.values, valid, w, closed, emit_from);
                    let ctx = format!("iter {iter} n {n} w {w} {closed} emit_from {emit_from}");
                    check(&got, &want, &aggs, TOL, &ctx);
                    cases += 1;
                }
            }
        }
        assert!(cases > 5000);
    }

    #[test]
    fn all_equal_ts_and_many_duplicates() {
        let mut rng = Rng(7);
        let n = 50;
        let values: Vec<f64> = (0..n).map(|_| rng.unit() * 10.0).collect();
        let valid: Vec<bool> = (0..n).map(|i| i % 3 != 0).collect();
        for ts in [vec![5i64; n], (0..n as i64).map(|i| i / 10).collect()] {
            for closed in CLOSED {
                for w in [0, 1, 2, 100] {
                    for emit_from in [0, 7, n] {
                        let got =
                            rolling(&ts, &values, Some(&valid), w, closed, &Agg::ALL, emit_from)
                                .unwrap();
                        let want = reference(&ts, &values, Some(&valid), w, closed, emit_from);
                        check(&got, &want, &Agg::ALL, TOL, &format!("{closed} w {w}"));
                    }
                }
            }
        }
        // All rows share one window: right/both see all of them, left/none none.
        let ts = vec![3i64; 4];
        let v = [1.0, 2.0, 3.0, 4.0];
        let r = rolling(&ts, &v, None, 10, Closed::Right, &[Agg::Sum, Agg::Count], 0).unwrap();
        assert_eq!(r.columns[0].values, vec![10.0; 4]);
        assert_eq!(r.columns[1].counts(), Some(vec![4; 4]));
        let r = rolling(&ts, &v, None, 10, Closed::Left, &[Agg::Sum, Agg::Count], 0).unwrap();
        assert_eq!(r.columns[0].valid, vec![false; 4]);
        assert_eq!(r.columns[1].counts(), Some(vec![0; 4]));
    }

    #[test]
    fn small_examples() {
        let ts = [1, 2, 2, 4, 7];
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        let valid = [true, true, false, true, true];
        let aggs = [Agg::Sum, Agg::Count, Agg::Min, Agg::Var];
        let r = rolling(&ts, &v, Some(&valid), 2, Closed::Right, &aggs, 0).unwrap();
        // Windows (t-2, t] over non-null values: {1}, {1,2}, {1,2}, {4}, {5}.
        assert_eq!(r.columns[0].values, vec![1.0, 3.0, 3.0, 4.0, 5.0]);
        assert_eq!(r.columns[1].counts(), Some(vec![1, 2, 2, 1, 1]));
        assert_eq!(r.columns[2].values, vec![1.0, 1.0, 1.0, 4.0, 5.0]);
        assert_eq!(r.columns[3].valid, vec![false, true, true, false, false]);
        assert_eq!(r.columns[3].values[1..3], [0.5, 0.5]);
        let r = rolling(&ts, &v, None, 2, Closed::Both, &[Agg::Sum], 1).unwrap();
        // Windows [t-2, t] for rows 1..: {1,2,3}, {1,2,3}, {2,3,4}, {}.
        assert_eq!(r.columns[0].values, vec![6.0, 6.0, 9.0, 5.0]);
        let r = rolling(&ts, &v, None, 3, Closed::Left, &[Agg::Mean, Agg::Count], 0).unwrap();
        // [t-3, t): {}, {1}, {1}, {1,2,3}, {4}.
        assert_eq!(r.columns[0].valid, vec![false, true, true, true, true]);
        assert_eq!(r.columns[0].values[1..], [1.0, 1.0, 2.0, 4.0]);
        assert_eq!(r.columns[1].counts(), Some(vec![0, 1, 1, 3, 1]));
        let r = rolling(&ts, &v, None, 3, Closed::None, &[Agg::Max, Agg::Std], 0).unwrap();
        // (t-3, t): {}, {1}, {1}, {2,3}, {}.
        assert_eq!(r.columns[0].valid, vec![false, true, true, true, false]);
        assert_eq!(r.columns[0].values[1..4], [1.0, 1.0, 3.0]);
        assert_eq!(r.columns[1].valid, vec![false, false, false, true, false]);
        assert!((r.columns[1].values[3] - 0.5f64.sqrt()).abs() < 1e-15);
    }

    #[test]
    fn empty_single_and_no_aggs() {
        let r = rolling(&[], &[], None, 5, Closed::Right, &Agg::ALL, 0).unwrap();
        assert_eq!(r.columns.len(), 7);
        assert!(r.columns.iter().all(AggColumn::is_empty));
        let r = rolling(&[9], &[2.5], None, 0, Closed::Right, &Agg::ALL, 0).unwrap();
        // Window 0 closed right is empty.
        assert_eq!(r.column(Agg::Count).unwrap().values, vec![0.0]);
        assert_eq!(r.column(Agg::Sum).unwrap().get(0), None);
        let r = rolling(&[9], &[2.5], None, 0, Closed::Both, &Agg::ALL, 0).unwrap();
        for (a, want) in [
            (Agg::Sum, Some(2.5)),
            (Agg::Mean, Some(2.5)),
            (Agg::Min, Some(2.5)),
        ] {
            assert_eq!(r.column(a).unwrap().get(0), want);
        }
        assert_eq!(r.column(Agg::Var).unwrap().get(0), None);
        assert_eq!(r.column(Agg::Std).unwrap().get(0), None);
        assert_eq!(r.column(Agg::Count).unwrap().get(0), Some(1.0));
        let r = rolling(&[9], &[2.5], Some(&[false]), 1, Closed::Both, &Agg::ALL, 1).unwrap();
        assert!(r.columns.iter().all(AggColumn::is_empty));
        let r = rolling(&[1, 2], &[1.0, 2.0], None, 1, Closed::Both, &[], 0).unwrap();
        assert!(r.columns.is_empty());
    }

    #[test]
    fn errors() {
        let ts = [1, 2, 3];
        let v = [0.0; 3];
        let e = rolling(&ts, &v, None, -1, Closed::Right, &Agg::ALL, 0);
        assert_eq!(e, Err(RollingError::NegativeWindow(-1)));
        assert!(matches!(
            rolling(&ts, &v[..2], None, 1, Closed::Right, &Agg::ALL, 0),
            Err(RollingError::LengthMismatch { what: "values", .. })
        ));
        assert!(matches!(
            rolling(&ts, &v, Some(&[true]), 1, Closed::Right, &Agg::ALL, 0),
            Err(RollingError::LengthMismatch { what: "valid", .. })
        ));
        assert_eq!(
            rolling(&ts, &v, None, 1, Closed::Right, &Agg::ALL, 4),
            Err(RollingError::EmitFromOutOfRange {
                emit_from: 4,
                len: 3
            })
        );
        assert_eq!(
            rolling(&[1, 3, 2], &v, None, 1, Closed::Right, &Agg::ALL, 0),
            Err(RollingError::Unsorted { row: 2 })
        );
        for bad in [&[][..], &[1, 3], &[0, 2], &[0, 2, 1, 3], &[0, 4, 3]] {
            assert!(matches!(
                rolling_segments(
                    &ts,
                    &v,
                    None,
                    Segments::new(bad),
                    1,
                    Closed::Right,
                    &Agg::ALL
                ),
                Err(RollingError::BadOffsets(_))
            ));
        }
        assert_eq!(
            rolling_segments(
                &[1, 5, 2, 1],
                &[0.0; 4],
                None,
                Segments::new(&[0, 2, 4]),
                1,
                Closed::Right,
                &[]
            ),
            Err(RollingError::Unsorted { row: 3 })
        );
    }

    #[test]
    fn names_round_trip() {
        for a in Agg::ALL {
            assert_eq!(a.name().parse::<Agg>().unwrap(), a);
            assert_eq!(a.to_string().to_uppercase().parse::<Agg>().unwrap(), a);
        }
        assert_eq!("avg".parse::<Agg>().unwrap(), Agg::Mean);
        assert_eq!("stddev_samp".parse::<Agg>().unwrap(), Agg::Std);
        assert_eq!("variance".parse::<Agg>().unwrap(), Agg::Var);
        assert!(matches!(
            "median".parse::<Agg>(),
            Err(RollingError::UnknownAgg(_))
        ));
        for c in CLOSED {
            assert_eq!(c.name().parse::<Closed>().unwrap(), c);
        }
        assert_eq!(Closed::default(), Closed::Right);
        assert!(matches!(
            "open".parse::<Closed>(),
            Err(RollingError::UnknownClosed(_))
        ));
    }

    #[test]
    fn nulls_and_all_null_windows() {
        let mut rng = Rng(3);
        let n = 300;
        let ts: Vec<i64> = (0..n as i64).collect();
        let values: Vec<f64> = (0..n).map(|_| rng.unit()).collect();
        // Long runs of nulls so that whole windows are null.
        let valid: Vec<bool> = (0..n).map(|i| (i / 25) % 2 == 0 || i % 7 == 0).collect();
        for closed in CLOSED {
            for w in [0, 1, 3, 10, 30] {
                let got = rolling(&ts, &values, Some(&valid), w, closed, &Agg::ALL, 0).unwrap();
                let want = reference(&ts, &values, Some(&valid), w, closed, 0);
                check(&got, &want, &Agg::ALL, TOL, &format!("{closed} w {w}"));
            }
        }
        let none = vec![false; n];
        let r = rolling(&ts, &values, Some(&none), 5, Closed::Both, &Agg::ALL, 0).unwrap();
        for col in &r.columns {
            if col.agg == Agg::Count {
                assert_eq!(col.counts(), Some(vec![0; n]));
            } else {
                assert!(col.valid.iter().all(|v| !v));
            }
        }
    }

    #[test]
    fn nan_and_infinities_do_not_panic() {
        let mut rng = Rng(11);
        for _ in 0..200 {
            let n = rng.below(60) as usize;
            let mut c = random_case(&mut rng, n);
            for x in &mut c.values {
                *x = match rng.below(8) {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    _ => *x,
                };
            }
            let valid = c.valid.as_deref();
            for w in windows_for(&mut rng, &c.ts) {
                for closed in CLOSED {
                    // Reference and kernel agree that a window holding an
                    // infinity or NaN has a NaN (or infinite) sum / variance.
                    let got = rolling(&c.ts, &c.values, valid, w, closed, &Agg::ALL, 0).unwrap();
                    let want = reference(&c.ts, &c.values, valid, w, closed, 0);
                    check(
                        &got,
                        &want,
                        &Agg::ALL,
                        TOL,
                        &format!("specials {closed} w {w}"),
                    );
                }
            }
        }
    }

    #[test]
    fn segments_match_per_group_calls() {
        let mut rng = Rng(99);
        for _ in 0..50 {
            let groups = rng.below(5) as usize;
            let mut ts = Vec::new();
            let mut values = Vec::new();
            let mut valid = Vec::new();
            let mut offsets = vec![0];
            for _ in 0..groups {
                let n = rng.below(40) as usize;
                let c = random_case(&mut rng, n);
                ts.extend(&c.ts);
                values.extend(&c.values);
                valid.extend(c.valid.unwrap_or_else(|| vec![true; n]));
                offsets.push(ts.len());
            }
            for closed in CLOSED {
                let w = rng.below(20) as i64;
                let aggs = random_aggs(&mut rng);
                let got = rolling_segments(
                    &ts,
                    &values,
                    Some(&valid),
                    Segments::new(&offsets),
                    w,
                    closed,
                    &aggs,
                )
                .unwrap();
                let mut want = Vec::new();
                for g in offsets.windows(2) {
                    let r = g[0]..g[1];
                    want.extend(reference(
                        &ts[r.clone()],
                        &values[r.clone()],
                        Some(&valid[r]),
                        w,
                        closed,
                        0,
                    ));
                }
                check(&got, &want, &aggs, TOL, "segments");
                // Lookback rows: the same windows, output from emit_from on.
                let from = rng.below(ts.len() as u64 + 1) as usize;
                let segs = Segments {
                    offsets: &offsets,
                    emit_from: from,
                };
                let tail =
                    rolling_segments(&ts, &values, Some(&valid), segs, w, closed, &aggs).unwrap();
                check(&tail, &want[from..], &aggs, TOL, "segments from a row");
            }
        }
        let past = Segments {
            offsets: &[0, 2],
            emit_from: 3,
        };
        assert_eq!(
            rolling_segments(&[1, 2], &[0.0; 2], None, past, 1, Closed::Right, &[]),
            Err(RollingError::EmitFromOutOfRange {
                emit_from: 3,
                len: 2
            })
        );
    }

    #[test]
    fn variance_near_the_overflow_threshold_stays_finite() {
        // Windows of two rows, +-9e153: m2 = 2 * 8.1e307 = 1.62e308 fits,
        // while the merge's delta^2 (3.24e308) alone would not.
        let n = 40usize;
        let ts: Vec<i64> = (0..n as i64).collect();
        let values: Vec<f64> = (0..n)
            .map(|i| if i % 2 == 0 { 9e153 } else { -9e153 })
            .collect();
        let got = rolling(&ts, &values, None, 2, Closed::Right, &[Agg::Var], 0).unwrap();
        let var = &got.columns[0];
        for i in 1..n {
            let v = var.values[i];
            assert!(
                var.valid[i] && (v - 1.62e308).abs() <= 1e-12 * 1.62e308,
                "row {i}: {v}"
            );
        }
    }

    #[test]
    fn large_magnitude_variance() {
        let mut rng = Rng(5);
        let n: usize = 3000;
        let ts: Vec<i64> = (0..n as i64).map(|i| i * 3 + (i % 4)).collect();
        for noise in [1.0, 1e-2] {
            let values: Vec<f64> = (0..n).map(|_| 1e9 + (rng.unit() - 0.5) * noise).collect();
            for w in [10, 30, 300, 100_000] {
                let got = rolling(
                    &ts,
                    &values,
                    None,
                    w,
                    Closed::Right,
                    &[Agg::Var, Agg::Std, Agg::Mean],
                    0,
                )
                .unwrap();
                let want = reference(&ts, &values, None, w, Closed::Right, 0);
                check(
                    &got,
                    &want,
                    &[Agg::Var, Agg::Std, Agg::Mean],
                    (1e-9, 0.0),
                    &format!("noise {noise} w {w}"),
                );
            }
        }
    }

    #[test]
    fn no_drift_over_long_inputs() {
        // A trend, noise and rare huge outliers entering and leaving the
        // window: the result must still match a two-pass on the window.
        let mut rng = Rng(17);
        let n: usize = 200_000;
        let ts: Vec<i64> = (0..n as i64).collect();
        let values: Vec<f64> = (0..n)
            .map(|i| {
                if i % 10_007 == 5 {
                    1e15
                } else {
                    i as f64 * 1e3 + rng.unit()
                }
            })
            .collect();
        let w = 50usize;
        let aggs = [Agg::Sum, Agg::Mean, Agg::Var, Agg::Min, Agg::Max];
        let got = rolling(&ts, &values, None, w as i64, Closed::Right, &aggs, 0).unwrap();
        for i in (0..n).step_by(7) {
            let s = &values[(i + 1).saturating_sub(w)..=i];
            let want = stats(s);
            for (col, &agg) in got.columns.iter().zip(&aggs) {
                match (col.get(i), want[agg_index(agg)]) {
                    (Some(g), Some(wv)) => {
                        assert!(close(g, wv, 1e-9, 1.0), "{agg} row {i}: got {g}, want {wv}")
                    }
                    (g, wv) => assert_eq!(g, wv, "{agg} row {i}"),
                }
            }
        }
    }

    /// Throughput check: `cargo test -p braid-kernels --release -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run in release"]
    fn throughput_10m() {
        let mut rng = Rng(1);
        let n: usize = 10_000_000;
        let mut t = 0i64;
        let ts: Vec<i64> = (0..n)
            .map(|_| {
                t += rng.below(3) as i64;
                t
            })
            .collect();
        let values: Vec<f64> = (0..n).map(|_| rng.unit()).collect();
        let valid: Vec<bool> = (0..n).map(|_| !rng.chance(0.05)).collect();
        for aggs in [
            &[Agg::Sum, Agg::Mean, Agg::Min, Agg::Max, Agg::Count][..],
            &[Agg::Sum, Agg::Mean, Agg::Min, Agg::Max, Agg::Std][..],
            &[Agg::Sum][..],
            &[Agg::Min, Agg::Max][..],
        ] {
            for w in [10, 1000] {
                for v in [None, Some(&valid[..])] {
                    // Best of 3, to see through other load on the machine.
                    let best = (0..3)
                        .map(|_| {
                            let t0 = std::time::Instant::now();
                            let r = rolling(&ts, &values, v, w, Closed::Right, aggs, 0).unwrap();
                            let dt = t0.elapsed().as_secs_f64();
                            assert_eq!(r.columns[0].len(), n);
                            dt
                        })
                        .fold(f64::INFINITY, f64::min);
                    eprintln!("{aggs:?} w {w} nulls {}: {best:.3} s", v.is_some());
                }
            }
        }
    }

    /// Calendar windows against the O(n^2) reference, whose edges are
    /// each row's own `t - w`: rows over a few months of microseconds,
    /// many at the ends of months (where the day is clamped and a later
    /// row's window can start before an earlier row's), in groups.
    #[test]
    fn calendar_windows_match_the_reference() {
        const DAY: i64 = 86_400_000_000;
        let mut rng = Rng(77);
        for case in 0..60 {
            let n = 1 + rng.below(400) as usize;
            // 2023-12-01 (a year before a leap February) plus a few months.
            let t0 = 19_692 * DAY;
            let mut ts: Vec<i64> = (0..n)
                .map(|_| {
                    let day = if rng.chance(0.5) {
                        // Days 27..31 of some month, then clamped targets.
                        let m = rng.below(6) as i64;
                        m * 30 + 26 + rng.below(6) as i64
                    } else {
                        rng.below(200) as i64
                    };
                    t0 + day * DAY + rng.below(4) as i64 * (DAY / 4) * i64::from(rng.chance(0.7))
                })
                .collect();
            ts.sort_unstable();
            let values: Vec<f64> = (0..n).map(|_| rng.unit() * 20.0 - 10.0).collect();
            let valid: Vec<bool> = (0..n).map(|_| !rng.chance(0.1)).collect();
            let months = [1u32, 1, 2, 3, 12][rng.below(5) as usize];
            let then = [0, 0, 1, DAY / 2, 15 * DAY][rng.below(5) as usize];
            let w = Window::Calendar {
                months,
                then,
                unit: CalendarUnit::Micros,
            };
            for closed in [Closed::Right, Closed::Both, Closed::Left, Closed::None] {
                let ctx = format!("case {case} months {months} then {then} {closed:?}");
                let emit_from = rng.below(n as u64 + 1) as usize;
                let got =
                    rolling(&ts, &values, Some(&valid), w, closed, &Agg::ALL, emit_from).unwrap();
                let want = reference(&ts, &values, Some(&valid), w, closed, emit_from);
                check(&got, &want, &Agg::ALL, (1e-9, 1e-9), &ctx);
                // Groups: split at random points.
                let mut offsets = vec![0];
                for j in 1..n {
                    if rng.chance(0.02) && ts[j] > ts[j - 1] {
                        offsets.push(j);
                    }
                }
                offsets.push(n);
                let got = rolling_segments(
                    &ts,
                    &values,
                    Some(&valid),
                    Segments::new(&offsets),
                    w,
                    closed,
                    &Agg::ALL,
                )
                .unwrap();
                let mut want = Vec::new();
                for g in offsets.windows(2) {
                    want.extend(reference(
                        &ts[g[0]..g[1]],
                        &values[g[0]..g[1]],
                        Some(&valid[g[0]..g[1]]),
                        w,
                        closed,
                        0,
                    ));
                }
                check(&got, &want, &Agg::ALL, (1e-9, 1e-9), &ctx);
            }
        }
    }
}
