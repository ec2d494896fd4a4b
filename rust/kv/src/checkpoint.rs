//! Checkpoints: copies of a hybrid cache's recurrent states at chosen
//! positions. Keys and values can be cut back to any prefix; a recurrent
//! state has read every position it holds and cannot. A prompt that parts
//! from what the cache holds at position P resumes from the newest copy that
//! stands at or before P (its keys and values below that position are still
//! the conversation's own), and reads from zero only when none does.
//!
//! A checkpoint knows the tokens it read (a hash of them), so it serves only
//! a prompt that begins with those tokens, and a checksum of its bytes, so a
//! copy damaged in memory is refused rather than restored.

use xxhash_rust::xxh3::xxh3_64;

use crate::KvCache;

/// Why a checkpoint was taken (what the log says of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Where a new prompt parted from the tokens the cache held.
    Parted,
    /// Every so many positions of a long prompt.
    Interval,
    /// Where the caller said the next request will part (the chat layer
    /// knows where a reply's history form leaves the generation prompt).
    Hint,
}

impl Taken {
    pub fn name(self) -> &'static str {
        match self {
            Taken::Parted => "where a prompt parted",
            Taken::Interval => "interval",
            Taken::Hint => "where the next turn parts",
        }
    }
}

/// The recurrent states after the first `pos` positions of some tokens.
#[derive(Clone)]
pub struct Checkpoint {
    pos: usize,
    tokens: u64,
    /// Every recurrent state, one after another in the cache's order.
    states: Vec<f32>,
    checksum: u64,
    /// Order of creation: the oldest is dropped first.
    serial: u64,
    taken: Taken,
}

impl Checkpoint {
    /// Positions read: the state stands after position `pos - 1`.
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn taken(&self) -> Taken {
        self.taken
    }
    pub fn bytes(&self) -> usize {
        4 * self.states.len()
    }
    /// Whether this checkpoint read exactly `prompt[..pos]`.
    pub fn serves(&self, prompt: &[u32]) -> bool {
        prompt.len() >= self.pos && hash_tokens(&prompt[..self.pos]) == self.tokens
    }
}

/// How many checkpoints a sequence keeps and where reads take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CheckpointPolicy {
    /// At most this many per sequence (0: none are taken).
    pub max: usize,
    /// A long prompt is checkpointed this many positions after the last
    /// checkpoint at or before where its read began (0: never).
    pub interval: usize,
    /// Interval checkpoints keep at least this far from any other; when the
    /// list is full, one this close to its predecessor goes before the oldest.
    pub min_step: usize,
}

/// Interval checkpoints stand on this grid of positions, the one the chunked
/// delta rule's chunks lie on, so a read resumed from one does the same
/// arithmetic as a read from zero.
pub const CHECKPOINT_GRID: usize = 64;

/// Why a checkpoint could not be restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreRefused {
    /// It read other tokens than the prompt's first `pos`.
    OtherTokens,
    /// Its bytes no longer match the checksum taken with them.
    Damaged,
    /// The cache could not stand at its position (a sliding-window ring no
    /// longer holds what that position needs): the cache was cleared.
    Position { wanted: usize, stood: usize },
    /// Its states are not this cache's shape.
    Shape,
}

impl std::fmt::Display for RestoreRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreRefused::OtherTokens => write!(f, "it read other tokens"),
            RestoreRefused::Damaged => write!(f, "its bytes failed their checksum"),
            RestoreRefused::Position { wanted, stood } => {
                write!(f, "the cache stood at {stood} after restoring it, not at its {wanted}")
            }
            RestoreRefused::Shape => write!(f, "its states do not fit this cache"),
        }
    }
}

/// A sequence's checkpoints, in order of position.
#[derive(Clone, Default)]
pub struct Checkpoints {
    list: Vec<Checkpoint>,
    serial: u64,
}

impl Checkpoints {
    pub fn len(&self) -> usize {
        self.list.len()
    }
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = &Checkpoint> {
        self.list.iter()
    }
    pub fn bytes(&self) -> usize {
        self.list.iter().map(Checkpoint::bytes).sum()
    }
    pub fn clear(&mut self) {
        self.list.clear();
    }

    /// The checkpoint standing furthest along, at or before `at`, that read
    /// `prompt`'s own tokens: chosen by where it ends, the only place a
    /// state is valid.
    pub fn newest_for(&self, prompt: &[u32], at: usize) -> Option<&Checkpoint> {
        self.list.iter().rev().filter(|c| c.pos <= at).find(|c| c.serves(prompt))
    }

    /// Where the last checkpoint at or before `at` stands (0: none).
    pub fn last_at_or_before(&self, at: usize) -> usize {
        self.list.iter().rev().find(|c| c.pos <= at).map_or(0, |c| c.pos)
    }

    /// Drops the checkpoints beyond position `at`: a prompt that parts there
    /// makes them another conversation's. One standing at `at` is kept.
    pub fn drop_after(&mut self, at: usize) {
        self.list.retain(|c| c.pos <= at);
    }

    /// Copies `cache`'s states, which stand after `tokens` (all it holds).
    pub fn take(&mut self, cache: &KvCache, tokens: &[u32], taken: Taken, policy: &CheckpointPolicy) {
        debug_assert_eq!(tokens.len(), cache.len());
        if policy.max == 0 || cache.states.is_empty() {
            return;
        }
        let mut states = Vec::with_capacity(cache.states_len());
        cache.copy_states_into(&mut states);
        self.insert(tokens, states, taken, policy);
    }

    /// Keeps `states` (every recurrent state, one after another in a cache's
    /// order), which stand after `tokens`.
    pub fn insert(&mut self, tokens: &[u32], states: Vec<f32>, taken: Taken, policy: &CheckpointPolicy) {
        if policy.max == 0 {
            return;
        }
        let checksum = xxh3_64(as_bytes(&states));
        self.serial += 1;
        let ck =
            Checkpoint { pos: tokens.len(), tokens: hash_tokens(tokens), states, checksum, serial: self.serial, taken };
        self.list.retain(|c| c.pos != ck.pos);
        let at = self.list.partition_point(|c| c.pos < ck.pos);
        self.list.insert(at, ck);
        self.fit(policy);
    }

    /// Drops checkpoints until at most `policy.max` are left: one within
    /// `min_step` of its predecessor first (never the one taken last),
    /// else the oldest.
    pub fn fit(&mut self, policy: &CheckpointPolicy) {
        let newest = self.serial;
        while self.list.len() > policy.max {
            let crowded = (1..self.list.len()).find(|&i| {
                let c = &self.list[i];
                c.serial != newest && policy.min_step > 0 && c.pos - self.list[i - 1].pos < policy.min_step
            });
            let oldest = || (0..self.list.len()).min_by_key(|&i| self.list[i].serial).expect("the list is not empty");
            self.list.remove(crowded.unwrap_or_else(oldest));
        }
    }

    /// Restores `ck` (one of these) into `cache` for `prompt`: the cache then
    /// holds `prompt[..ck.pos()]`. On a refusal after the cache was touched,
    /// the cache is cleared: never a wrong state.
    pub fn restore(&self, ck: &Checkpoint, cache: &mut KvCache, prompt: &[u32]) -> Result<(), RestoreRefused> {
        if !ck.serves(prompt) {
            return Err(RestoreRefused::OtherTokens);
        }
        if xxh3_64(as_bytes(&ck.states)) != ck.checksum {
            return Err(RestoreRefused::Damaged);
        }
        if cache.states_len() != ck.states.len() {
            return Err(RestoreRefused::Shape);
        }
        if ck.pos > cache.len() {
            return Err(RestoreRefused::Position { wanted: ck.pos, stood: cache.len() });
        }
        let stood = cache.rewind(ck.pos);
        if stood != ck.pos {
            cache.clear();
            return Err(RestoreRefused::Position { wanted: ck.pos, stood });
        }
        cache.set_states(&ck.states);
        Ok(())
    }

    /// Damages checkpoint `i`'s bytes (for tests of the checksum).
    #[doc(hidden)]
    pub fn damage(&mut self, i: usize) {
        if let Some(v) = self.list.get_mut(i).and_then(|c| c.states.first_mut()) {
            *v = f32::from_bits(v.to_bits() ^ 1);
        }
    }
}

pub fn hash_tokens(tokens: &[u32]) -> u64 {
    xxh3_64(bytemuck::cast_slice(tokens))
}

fn as_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KvType, LayerShape};

    const POLICY: CheckpointPolicy = CheckpointPolicy { max: 8, interval: 0, min_step: 0 };

    fn cache(window: Option<usize>) -> KvCache {
        let shape = LayerShape { k_width: 32, v_width: 32, window };
        KvCache::new(KvType::F32, 64, 4, &[shape]).with_states(&[6, 3])
    }

    /// Advances `c` by `n` positions, as a pass would, its states marked
    /// with the position they stand after.
    fn feed(c: &mut KvCache, n: usize) {
        for _ in 0..n {
            let pos = c.len();
            c.write(0, pos, &[pos as f32; 32], &[0.5; 32]);
            c.commit(1);
        }
        let at = c.len() as f32;
        c.state_mut(0).iter_mut().enumerate().for_each(|(i, v)| *v = at + i as f32);
        c.state_mut(1).fill(-at);
    }

    fn tokens(n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| i * 3 + 1).collect()
    }

    #[test]
    fn a_restore_brings_back_the_states_and_the_position() {
        let (mut c, mut cks, prompt) = (cache(None), Checkpoints::default(), tokens(40));
        feed(&mut c, 10);
        cks.take(&c, &prompt[..10], Taken::Parted, &POLICY);
        let want: Vec<Vec<f32>> = (0..2).map(|i| c.state(i).to_vec()).collect();
        feed(&mut c, 15);
        let ck = cks.newest_for(&prompt, 30).unwrap().clone();
        cks.restore(&ck, &mut c, &prompt).unwrap();
        assert_eq!(c.len(), 10);
        assert_eq!((0..2).map(|i| c.state(i).to_vec()).collect::<Vec<_>>(), want);
        // The keys below the checkpoint are the conversation's own.
        let mut row = [0.0; 32];
        c.keys(0).widen(9 * 32, &mut row);
        assert_eq!(row, [9.0; 32]);
    }

    /// Chosen by where a checkpoint ends, never where it starts: every
    /// state here began at 0, and only one ending at or before the parting
    /// position is valid.
    #[test]
    fn the_newest_checkpoint_ending_at_or_before_the_parting_serves() {
        let (mut c, mut cks, prompt) = (cache(None), Checkpoints::default(), tokens(40));
        for n in [10, 10, 10] {
            feed(&mut c, n);
            cks.take(&c, &prompt[..c.len()], Taken::Interval, &POLICY);
        }
        assert_eq!(cks.newest_for(&prompt, 25).map(Checkpoint::pos), Some(20));
        assert_eq!(cks.newest_for(&prompt, 20).map(Checkpoint::pos), Some(20));
        assert_eq!(cks.newest_for(&prompt, 39).map(Checkpoint::pos), Some(30));
        assert_eq!(cks.newest_for(&prompt, 9).map(Checkpoint::pos), None);
        // A prompt that differs at position 15 is served by the one at 10 alone.
        let mut other = prompt.clone();
        other[15] += 1;
        assert_eq!(cks.newest_for(&other, 39).map(Checkpoint::pos), Some(10));
    }

    #[test]
    fn a_checkpoint_of_other_tokens_or_damaged_bytes_is_refused() {
        let (mut c, mut cks, prompt) = (cache(None), Checkpoints::default(), tokens(40));
        feed(&mut c, 12);
        cks.take(&c, &prompt[..12], Taken::Parted, &POLICY);
        feed(&mut c, 3);
        let ck = cks.iter().next().unwrap().clone();
        let mut other = prompt.clone();
        other[0] += 1;
        assert_eq!(cks.restore(&ck, &mut c, &other), Err(RestoreRefused::OtherTokens));
        cks.damage(0);
        let ck = cks.iter().next().unwrap().clone();
        assert_eq!(cks.restore(&ck, &mut c, &prompt), Err(RestoreRefused::Damaged));
        // Neither refusal touched the cache.
        assert_eq!(c.len(), 15);
    }

    /// A ring that has overwritten what the checkpoint's position needs
    /// cannot stand there: the cache is cleared, not left half restored.
    #[test]
    fn a_position_the_ring_cannot_stand_at_clears_the_cache() {
        let (mut c, mut cks, prompt) = (cache(Some(4)), Checkpoints::default(), tokens(40));
        feed(&mut c, 3);
        cks.take(&c, &prompt[..3], Taken::Parted, &POLICY);
        feed(&mut c, 30);
        let ck = cks.iter().next().unwrap().clone();
        assert_eq!(cks.restore(&ck, &mut c, &prompt), Err(RestoreRefused::Position { wanted: 3, stood: 0 }));
        assert_eq!(c.len(), 0);
        assert!(c.state(0).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_parting_keeps_the_checkpoint_standing_there() {
        let (mut c, mut cks, prompt) = (cache(None), Checkpoints::default(), tokens(40));
        for _ in 0..3 {
            feed(&mut c, 10);
            cks.take(&c, &prompt[..c.len()], Taken::Interval, &POLICY);
        }
        cks.drop_after(20);
        assert_eq!(cks.iter().map(Checkpoint::pos).collect::<Vec<_>>(), [10, 20]);
    }

    #[test]
    fn a_full_list_drops_a_crowded_checkpoint_then_the_oldest() {
        let (mut c, prompt) = (cache(None), tokens(64));
        let mut cks = Checkpoints::default();
        let policy = CheckpointPolicy { max: 3, interval: 0, min_step: 5 };
        for n in [10, 10, 2, 10] {
            feed(&mut c, n);
            cks.take(&c, &prompt[..c.len()], Taken::Interval, &policy);
        }
        // 22 stood 2 past 20: it went first.
        assert_eq!(cks.iter().map(Checkpoint::pos).collect::<Vec<_>>(), [10, 20, 32]);
        feed(&mut c, 10);
        cks.take(&c, &prompt[..c.len()], Taken::Interval, &policy);
        assert_eq!(cks.iter().map(Checkpoint::pos).collect::<Vec<_>>(), [20, 32, 42]);
        // Taken again at one position, a checkpoint replaces the one there.
        cks.take(&c, &prompt[..c.len()], Taken::Hint, &policy);
        assert_eq!(cks.len(), 3);
        assert_eq!(cks.iter().last().map(Checkpoint::taken), Some(Taken::Hint));
        let none = CheckpointPolicy { max: 0, ..policy };
        let mut off = Checkpoints::default();
        off.take(&c, &prompt[..c.len()], Taken::Parted, &none);
        assert!(off.is_empty());
    }
}
