//! Several conversations in one pass: a fixed set of slots, each a session
//! with the tokens its cache holds, and a step that builds one pass from
//! every slot with work (a chunk of a prompt still to read, or the token
//! drawn last) so the weights are read once for all of them.
//!
//! A long prompt is read a chunk per step, between the decode steps of the
//! others, so it does not stall their tokens. What a slot gets is what it
//! would get alone (the pass is bit-for-bit column-independent), so batching
//! changes no answer.

use std::sync::Arc;

use ember_kv::{CheckpointPolicy, Checkpoints, RestoreRefused, Taken, CHECKPOINT_GRID};

use crate::error::{ModelError, Result};
use crate::forward::{Logits, SeqPass, Snapshot, Workspace};
use crate::generate::{Draws, GenerateParams, Slot, Step};
use crate::{KvType, Model};

/// A saved slot: this mark, the model's description (its family and shape,
/// length-prefixed), the tokens held, then the cache's own state.
const SLOT_MAGIC: &[u8; 8] = b"EMSLOT2\0";

/// A request being answered in a slot.
struct Active {
    draws: Draws,
    /// Prompt tokens not read yet.
    to_read: Vec<u32>,
    /// The token drawn last and any the grammar forced after it, to be fed
    /// in the next pass.
    pending: Vec<u32>,
    n_prompt: usize,
    n_cached: usize,
    /// Positions of the prompt where its read takes a checkpoint, in order.
    plan: Vec<(usize, Taken)>,
}

struct SlotState {
    slot: Slot,
    active: Option<Active>,
    /// Step counter when the slot last finished or started, for choosing
    /// the one unused the longest.
    last_used: u64,
    /// Copies of a hybrid's recurrent states along the tokens held.
    checkpoints: Checkpoints,
    /// Whose prompt the held tokens are (see [`Batcher::start_as`]).
    owner: u64,
}

impl SlotState {
    /// Forgets what the slot holds, its rows' memory given back.
    fn forget(&mut self) {
        self.slot.session.cache.release();
        self.slot.tokens.clear();
        self.checkpoints.clear();
    }
}

/// What one slot's request did in a step.
#[derive(Debug)]
pub enum SlotEvent {
    /// A token was drawn (`step.stop` set on the last).
    Step(Step),
    /// The request ended without drawing (it asked for no tokens).
    Done,
    /// The request failed (its slot is free again, its cache dropped).
    Failed(ModelError),
}

pub struct Batcher {
    model: Arc<Model>,
    slots: Vec<SlotState>,
    ws: Workspace,
    /// Most prompt tokens one slot reads in one pass.
    chunk: usize,
    steps: u64,
    last_pass: Vec<PassPart>,
    /// Conversations kept in host memory after their slot went to another,
    /// oldest first.
    host: Vec<HostEntry>,
    host_budget: usize,
    checkpoints: CheckpointPolicy,
    /// Floats of every recurrent state of a slot (0: the model has none).
    state_floats: usize,
    /// Thousandths of a prompt a free slot must already hold to be chosen
    /// for it (0: the choice ignores what slots hold).
    similarity_permille: usize,
    /// Positions all slots may hold together, where they share one context
    /// ([`new_unified`](Self::new_unified)); each may grow to all of it.
    pool: Option<usize>,
}

struct HostEntry {
    tokens: Vec<u32>,
    state: Vec<u8>,
    checkpoints: Checkpoints,
    owner: u64,
}

impl HostEntry {
    fn bytes(&self) -> usize {
        self.state.len() + self.checkpoints.bytes()
    }
}

/// What one busy slot feeds in a pass, and the checkpoints its read takes
/// inside it.
struct Feed {
    slot: usize,
    tokens: Vec<u32>,
    /// The prompt's last tokens, or a drawn one: the pass gives its logits.
    last: bool,
    /// The logits the draw reads: the last row's, or only its top (see
    /// `Draws::top_needed`); none before a prompt's last pass.
    want: Logits,
    snapshots: Vec<Snapshot>,
    takens: Vec<Taken>,
}

/// Shorter conversations are cheaper to read again than to keep.
const MIN_HOST_PREFIX: usize = 32;

/// The owner of every prompt where the caller tells owners apart by none
/// (a server without API keys: every client shares the cache).
pub const EVERYONE: u64 = 0;

/// One slot's share of a pass, for logs: how many tokens it fed, and
/// whether they were prompt (else the token drawn last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassPart {
    pub slot: usize,
    pub tokens: usize,
    pub prompt: bool,
}

/// How a request was placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    pub slot: usize,
    /// Prompt positions reused from the slot's cache.
    pub n_cached: usize,
    pub resume: Resume,
}

/// How a prompt met what its slot held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resume {
    /// Nothing held was shared (or the request asked for no caching).
    Fresh,
    /// The prompt continues what the slot held, or keys and values alone
    /// are cut back to where it parts.
    Kept,
    /// A hybrid's prompt parted at `parted`: the checkpoint at `pos` was
    /// restored, and the read goes on from there.
    Restored { parted: usize, pos: usize, taken: Taken },
    /// A hybrid's prompt parted at `parted`, and no checkpoint at or
    /// before it read these tokens: the read starts from zero.
    NoCheckpoint { parted: usize },
    /// The checkpoint at `pos` was refused: the read starts from zero.
    Refused { parted: usize, pos: usize, why: RestoreRefused },
}

impl std::fmt::Display for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resume::Fresh => write!(f, "read from the start"),
            Resume::Kept => write!(f, "prefix kept"),
            Resume::Restored { parted, pos, taken } => {
                write!(f, "parted at {parted}: restored the checkpoint at {pos} ({})", taken.name())
            }
            Resume::NoCheckpoint { parted } => {
                write!(f, "parted at {parted}: no checkpoint at or before it, read from the start")
            }
            Resume::Refused { parted, pos, why } => {
                write!(f, "parted at {parted}: the checkpoint at {pos} was refused ({why}), read from the start")
            }
        }
    }
}

fn shared(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Positions of `prompt` a slot holding `tokens` (a hybrid's, when
/// `checkpoints` is `Some`) can keep: its shared prefix (less the last
/// token, which is read again for its logits), or for a hybrid that parts
/// from what it holds, the newest checkpoint at or before the parting.
fn reusable(tokens: &[u32], checkpoints: Option<&Checkpoints>, prompt: &[u32]) -> usize {
    let want = shared(tokens, prompt).min(prompt.len().saturating_sub(1));
    match checkpoints {
        Some(cks) if want < tokens.len() => cks.newest_for(prompt, want).map_or(0, |c| c.pos()),
        _ => want,
    }
}

impl Batcher {
    /// `n_slots` slots of `n_ctx` positions each, prompts read at most
    /// `chunk` tokens per slot per pass; refused where the sessions cannot
    /// be made (see [`Model::try_new_session`]).
    pub fn new(model: Arc<Model>, n_slots: usize, n_ctx: usize, chunk: usize, kv: KvType) -> Result<Batcher> {
        let chunk = chunk.max(1);
        let slots = (0..n_slots.max(1))
            .map(|_| {
                Ok(SlotState {
                    slot: Slot::new(model.try_new_session(n_ctx, chunk, kv)?),
                    active: None,
                    last_used: 0,
                    checkpoints: Checkpoints::default(),
                    owner: EVERYONE,
                })
            })
            .collect::<Result<_>>()?;
        let state_floats = model.config.state_lens().iter().sum();
        Ok(Batcher {
            model,
            slots,
            ws: Workspace::default(),
            chunk,
            steps: 0,
            last_pass: Vec::new(),
            host: Vec::new(),
            host_budget: 0,
            checkpoints: CheckpointPolicy::default(),
            state_floats,
            similarity_permille: 100,
            pool: None,
        })
    }

    /// `n_slots` slots sharing one context of `n_ctx` positions
    /// (llama-server's `--kv-unified`): any slot may hold up to all of it, as
    /// long as all of them together hold no more. Room for a pass is made by
    /// forgetting idle slots' conversations, the least recently used first
    /// (into the host cache, where it has room); a prompt waits for room its
    /// whole next piece fits (a smaller piece would not read as a read alone
    /// does); a conversation that finds no room for its next token ends as a
    /// full context would end it. A slot's memory is what it holds. The
    /// caches are the host's: a model on a device keeps a context a slot.
    pub fn new_unified(model: Arc<Model>, n_slots: usize, n_ctx: usize, chunk: usize, kv: KvType) -> Result<Batcher> {
        if model.placement().is_some() {
            return Err(ModelError::Invalid(
                "slots share one context only in the host's memory: this model's layers are on a device".into(),
            ));
        }
        let mut b = Batcher::new(model, n_slots, n_ctx, chunk, kv)?;
        b.pool = Some(n_ctx);
        Ok(b)
    }

    /// Whether the slots share one context.
    pub fn unified(&self) -> bool {
        self.pool.is_some()
    }

    /// Positions promised to the tokens drawn last (and any forced after
    /// them), which the next pass feeds.
    fn promised(&self) -> usize {
        self.slots.iter().filter_map(|s| s.active.as_ref()).map(|a| a.pending.len()).sum()
    }

    /// Positions every slot holds.
    fn held(&self) -> usize {
        self.slots.iter().map(|s| s.slot.session.len()).sum()
    }

    /// In a shared context, makes room for `need` positions beyond those
    /// held (and `promised` to conversations under way) by forgetting idle
    /// slots' conversations but `keep`'s, the least recently used first;
    /// whether they fit.
    fn make_room(&mut self, need: usize, promised: usize, keep: Option<usize>) -> bool {
        let Some(pool) = self.pool else { return true };
        while self.held() + promised + need > pool {
            let idle = self
                .slots
                .iter()
                .enumerate()
                .filter(|&(i, s)| s.active.is_none() && s.slot.session.len() > 0 && Some(i) != keep)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(i, _)| i);
            let Some(i) = idle else { return false };
            self.evict(i);
        }
        true
    }

    /// Forgets idle slot `i`'s conversation, kept in the host cache first
    /// where it has room (as when its slot goes to another prompt).
    fn evict(&mut self, i: usize) {
        let st = &self.slots[i];
        if self.host_budget > 0 && st.slot.tokens.len() >= MIN_HOST_PREFIX {
            if let Ok(state) = st.slot.session.save_state(&self.model) {
                let (tokens, checkpoints, owner) = (st.slot.tokens.clone(), st.checkpoints.clone(), st.owner);
                self.host.retain(|e| e.tokens != tokens || e.owner != owner);
                self.host.push(HostEntry { tokens, state, checkpoints, owner });
                self.trim_host();
            }
        }
        self.slots[i].forget();
    }

    /// Lowers the prompt tokens one slot reads in a pass below the pass size
    /// the slots' caches were made for (a measured chunk, say), without
    /// changing those caches: a saved slot's layout stays the pass size's,
    /// whatever chunk a later start measures.
    pub fn set_chunk(&mut self, chunk: usize) {
        let most = self.slots.first().map_or(chunk, |s| s.slot.session.cache.max_batch());
        self.chunk = chunk.clamp(1, most);
    }

    /// How much of a prompt (thousandths) a free slot must already hold for
    /// [`choose_slot`](Self::choose_slot) to give it that slot rather than an
    /// empty or the least recently used one; 0 ignores what slots hold
    /// (llama-server's `--slot-prompt-similarity`).
    pub fn set_slot_similarity(&mut self, permille: usize) {
        self.similarity_permille = permille.min(1000);
    }

    /// Where and how many checkpoints each slot of a hybrid keeps (none
    /// until set). Lowering the count drops what no longer fits.
    pub fn set_checkpoints(&mut self, policy: CheckpointPolicy) {
        self.checkpoints = policy;
        for st in &mut self.slots {
            st.checkpoints.fit(&policy);
        }
        for e in &mut self.host {
            e.checkpoints.fit(&policy);
        }
    }

    /// Bytes of one checkpoint: every recurrent state of a slot (0 for a
    /// model without them).
    pub fn checkpoint_bytes(&self) -> usize {
        4 * self.state_floats
    }

    /// Where slot `slot`'s checkpoints stand, and why each was taken.
    pub fn checkpoints(&self, slot: usize) -> Vec<(usize, Taken)> {
        self.slots[slot].checkpoints.iter().map(|c| (c.pos(), c.taken())).collect()
    }

    /// Damages checkpoint `i` of slot `slot` (for tests of the checksum).
    #[doc(hidden)]
    pub fn damage_checkpoint(&mut self, slot: usize, i: usize) {
        self.slots[slot].checkpoints.damage(i);
    }

    fn hybrid(&self) -> bool {
        self.state_floats > 0
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Bytes every slot's keys and values take, wherever they are held.
    pub fn cache_bytes(&self) -> usize {
        if self.pool.is_some() {
            // One context's positions in all, and each slot's own rings.
            let first = &self.slots[0].slot.session.cache;
            return first.memory_bytes() + (self.slots.len() - 1) * first.ring_bytes();
        }
        self.slots.iter().map(|s| s.slot.session.cache.memory_bytes()).sum()
    }

    pub fn is_busy(&self, slot: usize) -> bool {
        self.slots[slot].active.is_some()
    }

    /// Copies what slot `from` holds (its cache, tokens, checkpoints and
    /// owner) into idle slot `to`, so several answers to one prompt read it
    /// once: the others start in copies of the slot that read it. `from` may
    /// be busy; its copy is what it holds between two passes.
    pub fn fork(&mut self, from: usize, to: usize) -> Result<()> {
        let n = self.slots.len();
        if from >= n || to >= n || from == to {
            return Err(ModelError::Invalid(format!("cannot copy slot {from} into slot {to} of {n}")));
        }
        if self.slots[to].active.is_some() {
            return Err(ModelError::Invalid(format!("slot {to} is busy")));
        }
        if self.pool.is_some() {
            // The copy is a saving, not a promise: without room, the other answer reads the prompt itself.
            self.slots[to].forget();
            let need = self.slots[from].slot.session.len();
            if !self.make_room(need, self.promised(), Some(from)) {
                return Ok(());
            }
        }
        let src = &self.slots[from];
        let (state, tokens, checkpoints, owner) =
            (src.slot.session.save_state(&self.model)?, src.slot.tokens.clone(), src.checkpoints.clone(), src.owner);
        let steps = self.steps;
        let dst = &mut self.slots[to];
        if let Err(e) = dst.slot.session.restore_state(&self.model, &state) {
            dst.forget();
            return Err(e);
        }
        dst.slot.tokens = tokens;
        dst.checkpoints = checkpoints;
        dst.owner = owner;
        dst.last_used = steps;
        Ok(())
    }

    /// Ends the thought of the request in `slot` at its next draw (its close
    /// written after that token, as a spent `reasoning_budget` writes it);
    /// false where the slot is idle, or its request has no thought budget
    /// armed, or its thought is over.
    pub fn end_thought(&mut self, slot: usize) -> bool {
        self.slots.get_mut(slot).and_then(|s| s.active.as_mut()).is_some_and(|a| a.draws.end_thought())
    }

    pub fn any_busy(&self) -> bool {
        self.slots.iter().any(|s| s.active.is_some())
    }

    /// Tokens slot `slot` holds in its cache.
    pub fn cached_tokens(&self, slot: usize) -> &[u32] {
        &self.slots[slot].slot.tokens
    }

    /// The free slot llama-server would give `prompt`: the one whose held
    /// tokens share the longest prefix with it, if that is at least a tenth of
    /// the prompt; else one holding nothing; else the one unused the longest.
    pub fn choose_slot(&self, prompt: &[u32]) -> Option<usize> {
        self.choose_slot_of(EVERYONE, prompt)
    }

    /// [`choose_slot`](Self::choose_slot) for `owner`'s prompt: only what
    /// `owner`'s earlier prompts left counts as shared.
    pub fn choose_slot_of(&self, owner: u64, prompt: &[u32]) -> Option<usize> {
        let free = || self.slots.iter().enumerate().filter(|(_, s)| s.active.is_none());
        let shared = |s: &SlotState| {
            if s.owner != owner {
                return 0;
            }
            s.slot.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count()
        };
        if self.similarity_permille > 0 {
            let best = free().map(|(i, s)| (i, shared(s))).max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)));
            if let Some((i, n)) = best {
                if n > 0 && n * 1000 >= self.similarity_permille * prompt.len() {
                    return Some(i);
                }
            }
        }
        if let Some((i, _)) = free().find(|(_, s)| s.slot.tokens.is_empty()) {
            return Some(i);
        }
        free().min_by_key(|(_, s)| s.last_used).map(|(i, _)| i)
    }

    /// Places a request in free slot `slot`: its prompt is read over the next
    /// steps, from where it parts from the slot's cache (from the start
    /// without `cache_prompt`). A hybrid's read takes checkpoints where the
    /// prompt parted from what the slot held, at the `hints` (positions where
    /// the caller expects the next request to part), and at the policy's
    /// interval.
    pub fn start(
        &mut self,
        slot: usize,
        prompt: &[u32],
        params: GenerateParams,
        cache_prompt: bool,
        hints: &[usize],
    ) -> Result<Started> {
        self.start_as(EVERYONE, slot, prompt, params, cache_prompt, hints)
    }

    /// [`start`](Self::start) for `owner` (a server's API key, say): what a
    /// slot or the host cache holds of another owner's prompts is never
    /// reused for it, so one client cannot learn another's prompt from what
    /// its own reads were spared.
    pub fn start_as(
        &mut self,
        owner: u64,
        slot: usize,
        prompt: &[u32],
        params: GenerateParams,
        cache_prompt: bool,
        hints: &[usize],
    ) -> Result<Started> {
        let n_vocab = self.model.config.n_vocab;
        let st = self.slots.get_mut(slot).ok_or_else(|| ModelError::Invalid(format!("no slot {slot}")))?;
        if st.active.is_some() {
            return Err(ModelError::Invalid(format!("slot {slot} is busy")));
        }
        if prompt.is_empty() {
            return Err(ModelError::Invalid("the prompt is empty".into()));
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(ModelError::BadToken { id, n_vocab });
        }
        let n_ctx = st.slot.session.cache.n_ctx();
        if prompt.len() > n_ctx {
            return Err(ember_kv::KvError::ContextFull { needed: prompt.len(), capacity: n_ctx }.into());
        }
        let draws = Draws::new(&self.model, params, prompt)?;
        if cache_prompt {
            self.swap_with_host(slot, prompt, owner);
        }
        let hybrid = self.hybrid();
        let st = &mut self.slots[slot];
        if st.owner != owner {
            st.forget();
            st.owner = owner;
        }
        let (n_cached, resume, parted) = if !cache_prompt {
            st.forget();
            (0, Resume::Fresh, None)
        } else if hybrid {
            Self::resume_hybrid(st, prompt)
        } else {
            let n = st.slot.reuse_prefix(prompt);
            (n, if n > 0 { Resume::Kept } else { Resume::Fresh }, None)
        };
        st.slot.tokens = prompt[..n_cached].to_vec();
        let (mut n_cached, mut resume, mut parted) = (n_cached, resume, parted);
        if self.pool.is_some() && !self.make_room(0, self.promised(), Some(slot)) {
            // What the slot kept does not fit beside the conversations under way: read from the start.
            self.slots[slot].forget();
            (n_cached, resume, parted) = (0, Resume::Fresh, None);
        }
        let plan = if hybrid { self.plan(slot, prompt, n_cached, parted, hints) } else { Vec::new() };
        let st = &mut self.slots[slot];
        st.active = Some(Active {
            draws,
            to_read: prompt[n_cached..].to_vec(),
            pending: Vec::new(),
            n_prompt: prompt.len(),
            n_cached,
            plan,
        });
        st.last_used = self.steps;
        Ok(Started { slot, n_cached, resume })
    }

    /// Where a hybrid's slot resumes `prompt`: it continues what the slot
    /// holds, or restores the newest checkpoint at or before where the two
    /// part, or reads from zero. Returns the positions kept, how, and where
    /// the prompt parted from what was held (if it did).
    fn resume_hybrid(st: &mut SlotState, prompt: &[u32]) -> (usize, Resume, Option<usize>) {
        let held = st.slot.tokens.len();
        let want = shared(&st.slot.tokens, prompt).min(prompt.len() - 1);
        if want == held {
            let n = st.slot.reuse_prefix(prompt);
            return (n, if n > 0 { Resume::Kept } else { Resume::Fresh }, None);
        }
        // What the slot held past the parting is another conversation's.
        st.checkpoints.drop_after(want);
        let Some(ck) = st.checkpoints.newest_for(prompt, want) else {
            st.slot.session.cache.clear();
            st.slot.tokens.clear();
            let resume = if want > 0 { Resume::NoCheckpoint { parted: want } } else { Resume::Fresh };
            return (0, resume, Some(want));
        };
        let (pos, taken) = (ck.pos(), ck.taken());
        match st.checkpoints.restore(ck, &mut st.slot.session.cache, prompt) {
            Ok(()) => (pos, Resume::Restored { parted: want, pos, taken }, Some(want)),
            Err(why) => {
                st.slot.session.cache.clear();
                st.slot.tokens.clear();
                st.checkpoints.drop_after(pos - 1);
                (0, Resume::Refused { parted: want, pos, why }, Some(want))
            }
        }
    }

    /// The checkpoints slot `slot`'s read of `prompt` from position `from`
    /// takes: where it parted from what the slot held, at the caller's
    /// hints, and every `interval` positions counted from the checkpoint it
    /// resumed at (on the grid the delta rule's chunks lie on, so that
    /// resuming from one repeats a read from zero exactly).
    fn plan(
        &self,
        slot: usize,
        prompt: &[u32],
        from: usize,
        parted: Option<usize>,
        hints: &[usize],
    ) -> Vec<(usize, Taken)> {
        let policy = self.checkpoints;
        if policy.max == 0 {
            return Vec::new();
        }
        let len = prompt.len();
        let mut plan: Vec<(usize, Taken)> = Vec::new();
        plan.extend(parted.filter(|&p| p > from).map(|p| (p, Taken::Parted)));
        plan.extend(hints.iter().filter(|&&h| h > from && h <= len).map(|&h| (h, Taken::Hint)));
        let existing = &self.slots[slot].checkpoints;
        if policy.interval > 0 {
            let mut base = existing.last_at_or_before(from);
            loop {
                let at = (base + policy.interval).next_multiple_of(CHECKPOINT_GRID);
                if at >= len {
                    break;
                }
                let near = |p: usize| p.abs_diff(at) < policy.min_step;
                let crowded = plan.iter().any(|&(p, _)| near(p)) || existing.iter().any(|c| near(c.pos()));
                if at > from && !crowded {
                    plan.push((at, Taken::Interval));
                }
                base = at;
            }
        }
        plan.sort_by_key(|&(p, _)| p);
        plan.dedup_by_key(|&mut (p, _)| p);
        plan
    }

    /// Bytes the host prompt cache may hold (0: none; the default).
    pub fn set_host_cache(&mut self, bytes: usize) {
        self.host_budget = bytes;
        self.trim_host();
    }

    /// Conversations held in the host prompt cache, and their bytes.
    pub fn host_cache_usage(&self) -> (usize, usize) {
        (self.host.len(), self.host.iter().map(HostEntry::bytes).sum())
    }

    /// Before slot `slot` takes `prompt`: if the conversation it holds is
    /// about to be cut back by most of its length, keep it (with its
    /// checkpoints) in the host cache; and if the host cache holds a
    /// conversation the slot would keep more of than its own, bring that one
    /// into the slot instead of reading it again.
    fn swap_with_host(&mut self, slot: usize, prompt: &[u32], owner: u64) {
        if self.host_budget == 0 {
            return;
        }
        let hybrid = self.hybrid();
        let keeps = |tokens: &[u32], cks: &Checkpoints| reusable(tokens, hybrid.then_some(cks), prompt);
        let st = &self.slots[slot];
        let kept_here = if st.owner == owner { keeps(&st.slot.tokens, &st.checkpoints) } else { 0 };
        let theirs = |e: &HostEntry| if e.owner == owner { keeps(&e.tokens, &e.checkpoints) } else { 0 };
        let best = (0..self.host.len()).max_by_key(|&i| theirs(&self.host[i]));
        let from_host = best.map(|i| (i, theirs(&self.host[i]))).filter(|&(_, n)| n > kept_here && n >= MIN_HOST_PREFIX);
        // The slot's conversation would lose most of itself: keep it.
        let held = st.slot.tokens.len();
        // A state that cannot be read back (a device fault) is not kept:
        // the conversation is read again when it returns.
        let saved = (held >= MIN_HOST_PREFIX && kept_here * 2 < held).then(|| st.slot.session.save_state(&self.model).ok()).flatten();
        if let Some(state) = saved {
            let st = &mut self.slots[slot];
            let tokens = st.slot.tokens.clone();
            // The slot keeps its own: the new prompt may resume from one.
            let checkpoints = st.checkpoints.clone();
            let held_by = st.owner;
            self.host.retain(|e| e.tokens != tokens || e.owner != held_by);
            self.host.push(HostEntry { tokens, state, checkpoints, owner: held_by });
        }
        if let Some((i, _)) = from_host {
            let entry = self.host.remove(i);
            let st = &mut self.slots[slot];
            if st.slot.session.restore_state(&self.model, &entry.state).is_ok() {
                st.slot.tokens = entry.tokens;
                st.checkpoints = entry.checkpoints;
                st.owner = entry.owner;
            } else {
                st.forget();
            }
        }
        self.trim_host();
    }

    /// Drops the oldest conversations until the host cache fits its budget.
    fn trim_host(&mut self) {
        let mut total: usize = self.host.iter().map(HostEntry::bytes).sum();
        while total > self.host_budget && !self.host.is_empty() {
            total -= self.host.remove(0).bytes();
        }
    }

    /// Ends slot `slot`'s request; its cache keeps what was fed.
    pub fn cancel(&mut self, slot: usize) {
        if let Some(st) = self.slots.get_mut(slot) {
            st.active = None;
            st.last_used = self.steps;
        }
    }

    /// Prompt length and cached positions of slot `slot`'s request.
    pub fn request_info(&self, slot: usize) -> Option<(usize, usize)> {
        self.slots[slot].active.as_ref().map(|a| (a.n_prompt, a.n_cached))
    }

    /// Slot `slot`'s cache and the tokens it holds, as bytes that
    /// [`restore_slot`](Self::restore_slot) reads back (into a slot of the
    /// same model and size). Returns the bytes and the tokens saved.
    pub fn save_slot(&self, slot: usize) -> Result<(Vec<u8>, usize)> {
        let st = self.idle_slot(slot)?;
        let mut out = Vec::new();
        out.extend_from_slice(SLOT_MAGIC);
        let desc = self.description();
        out.extend_from_slice(&(desc.len() as u64).to_le_bytes());
        out.extend_from_slice(desc.as_bytes());
        out.extend_from_slice(&(st.slot.tokens.len() as u64).to_le_bytes());
        for t in &st.slot.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&st.slot.session.save_state(&self.model)?);
        Ok((out, st.slot.tokens.len()))
    }

    /// Loads a state written by [`save_slot`](Self::save_slot) into idle slot
    /// `slot`; returns the tokens restored. A state of another model or slot
    /// size is refused and leaves the slot as it was.
    pub fn restore_slot(&mut self, slot: usize, state: &[u8]) -> Result<usize> {
        self.restore_slot_as(EVERYONE, slot, state)
    }

    /// [`restore_slot`](Self::restore_slot), the tokens restored counted as
    /// `owner`'s (see [`start_as`](Self::start_as)).
    pub fn restore_slot_as(&mut self, owner: u64, slot: usize, state: &[u8]) -> Result<usize> {
        self.idle_slot(slot)?;
        let bad = |why: &str| ModelError::Invalid(format!("not a saved slot of this model and slot size: {why}"));
        if state.len() < SLOT_MAGIC.len() + 8 || &state[..SLOT_MAGIC.len()] != SLOT_MAGIC {
            return Err(bad("unknown format"));
        }
        let word = |at: usize| state.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
        let desc_at = SLOT_MAGIC.len() + 8;
        let desc_len = word(SLOT_MAGIC.len()).filter(|&n| n <= 4096).ok_or_else(|| bad("truncated"))?;
        let saved = state.get(desc_at..desc_at + desc_len).ok_or_else(|| bad("truncated"))?;
        let ours = self.description();
        if saved != ours.as_bytes() {
            return Err(bad(&format!("saved from {}; this slot holds {ours}", String::from_utf8_lossy(saved))));
        }
        let head = desc_at + desc_len + 8;
        let n = word(desc_at + desc_len).ok_or_else(|| bad("truncated"))?;
        let kv_at = n
            .checked_mul(4)
            .and_then(|b| b.checked_add(head))
            .filter(|&e| e <= state.len())
            .ok_or_else(|| bad("truncated"))?;
        let tokens: Vec<u32> =
            state[head..kv_at].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        if self.pool.is_some() {
            self.slots[slot].forget();
            if !self.make_room(tokens.len(), self.promised(), None) {
                return Err(ModelError::Invalid(format!(
                    "the context the slots share has no room for the saved slot's {} positions beside the \
                     conversations under way",
                    tokens.len()
                )));
            }
        }
        let st = &mut self.slots[slot];
        match st.slot.session.restore_state(&self.model, &state[kv_at..]) {
            Err(ModelError::Kv(e @ ember_kv::KvError::BadState(_))) => return Err(bad(&e.to_string())),
            r => r?,
        }
        if st.slot.session.cache.len() != tokens.len() {
            st.forget();
            return Err(bad("tokens and cache disagree"));
        }
        st.slot.tokens = tokens;
        st.owner = owner;
        // Checkpoints are not saved: those held were another conversation's.
        st.checkpoints.clear();
        st.last_used = self.steps;
        Ok(n)
    }

    /// Forgets what idle slot `slot` holds; returns the tokens dropped.
    pub fn erase_slot(&mut self, slot: usize) -> Result<usize> {
        self.idle_slot(slot)?;
        let st = &mut self.slots[slot];
        let n = st.slot.tokens.len();
        st.forget();
        Ok(n)
    }

    fn idle_slot(&self, slot: usize) -> Result<&SlotState> {
        let st = self
            .slots
            .get(slot)
            .ok_or_else(|| ModelError::Invalid(format!("no slot {slot} (there are {})", self.slots.len())))?;
        if st.active.is_some() {
            return Err(ModelError::Invalid(format!("slot {slot} is busy")));
        }
        Ok(st)
    }

    /// What a saved state must come from: the vocabulary, the layers and the
    /// architecture (the cache's own header checks the shapes).
    /// The family and shape a saved slot must match, in words (what a
    /// refusal names): a cache of another family, or of the same family at
    /// another size, cannot be read into this one.
    fn description(&self) -> String {
        let c = &self.model.config;
        format!(
            "a {} model of {} layers ({} with a cache of their own), width {}, {} tokens",
            c.arch.name(),
            c.n_layer,
            c.n_layer_kv,
            c.n_embd,
            c.n_vocab
        )
    }

    /// What went into the last pass.
    pub fn last_pass(&self) -> &[PassPart] {
        &self.last_pass
    }

    /// One pass over every busy slot; returns what each drew (slots still
    /// reading their prompt draw nothing). Empty when no slot is busy.
    pub fn step(&mut self) -> Vec<(usize, SlotEvent)> {
        self.steps += 1;
        let mut events = Vec::new();
        let chunk = self.chunk;
        // What each busy slot feeds in this pass, and the checkpoints its
        // read takes inside it.
        let mut feeds: Vec<Feed> = Vec::new();
        let state_floats = self.state_floats;
        self.last_pass.clear();
        // In a shared context the tokens drawn last had their positions
        // promised when drawn; a prompt's next piece is fed where it fits.
        // A prompt's piece also leaves each decoding conversation room for
        // the token after this pass's: a new prompt never cuts one short.
        let mut promised = if self.pool.is_some() {
            let decoding = self.slots.iter().filter_map(|s| s.active.as_ref()).filter(|a| !a.pending.is_empty()).count();
            self.promised() + decoding
        } else {
            0
        };
        let mut waiting = Vec::new();
        for i in 0..self.slots.len() {
            let Some(a) = self.slots[i].active.as_ref() else {
                continue;
            };
            if self.pool.is_some() && a.pending.is_empty() {
                let pos = self.slots[i].slot.session.cache.len();
                let n = a.to_read.len().min(chunk - pos % chunk);
                if !self.make_room(n, promised, None) {
                    waiting.push(i);
                    continue;
                }
                promised += n;
            }
            let st = &mut self.slots[i];
            let a = st.active.as_mut().expect("checked busy");
            let prompt = a.pending.is_empty();
            let pos = st.slot.session.cache.len();
            let (tokens, last) = if !prompt {
                (std::mem::take(&mut a.pending), true)
            } else {
                // Passes end where a read from zero's would: on multiples of
                // the chunk, whatever position this read resumed at.
                let n = a.to_read.len().min(chunk - pos % chunk);
                let rest = a.to_read.split_off(n);
                let tokens = std::mem::replace(&mut a.to_read, rest);
                (tokens, a.to_read.is_empty())
            };
            if let Err(e) = st.slot.session.cache.reserve(tokens.len()) {
                st.active = None;
                events.push((i, SlotEvent::Failed(e.into())));
                continue;
            }
            let (mut snapshots, mut takens) = (Vec::new(), Vec::new());
            if prompt {
                for &(at, taken) in a.plan.iter().take_while(|&&(at, _)| at < pos + tokens.len()) {
                    snapshots.push(Snapshot { at: at - pos, states: vec![0.0; state_floats] });
                    takens.push(taken);
                }
            }
            self.last_pass.push(PassPart { slot: i, tokens: tokens.len(), prompt });
            let want = match a.draws.top_needed(&self.model) {
                _ if !last => Logits::None,
                Some(k) => Logits::Top(k),
                None => Logits::Last,
            };
            feeds.push(Feed { slot: i, tokens, last, want, snapshots, takens });
        }
        if feeds.is_empty() {
            // Every conversation under way waits for room that none of them
            // will free: the one started last gives way.
            if let Some(&i) = waiting.iter().max_by_key(|&&i| self.slots[i].last_used) {
                let st = &mut self.slots[i];
                let needed = st.slot.session.len() + st.active.as_ref().map_or(0, |a| a.to_read.len());
                st.active = None;
                st.forget();
                let capacity = self.pool.unwrap_or(needed);
                events.push((i, SlotEvent::Failed(ember_kv::KvError::ContextFull { needed, capacity }.into())));
            }
            return events;
        }
        let mut parts: Vec<SeqPass<'_>> = Vec::with_capacity(feeds.len());
        let mut rest: &mut [SlotState] = &mut self.slots;
        let mut base = 0;
        for f in &mut feeds {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(f.slot - base);
            let (this, tail) = tail.split_first_mut().expect("slot index in range");
            rest = tail;
            base = f.slot + 1;
            parts.push(SeqPass {
                session: &mut this.slot.session,
                tokens: &f.tokens,
                want: f.want,
                snapshots: &mut f.snapshots,
                media: &[],
            });
        }
        if let Err(e) = self.model.forward_batch(&mut self.ws, &mut parts) {
            // Checked per slot above; a failure here is not one request's.
            // A device's fault stays one (the server's error, not the
            // request's), and what the slots held there is dropped.
            drop(parts);
            for f in &feeds {
                self.slots[f.slot].active = None;
                self.slots[f.slot].forget();
                let failed = match &e {
                    ModelError::Device(why) => ModelError::Device(format!("the pass failed: {why}")),
                    other => ModelError::Invalid(format!("the pass failed: {other}")),
                };
                events.push((f.slot, SlotEvent::Failed(failed)));
            }
            return events;
        }
        drop(parts);
        // In a shared context, each conversation that goes on is promised
        // room for its next tokens, idle slots' conversations giving way.
        if self.pool.is_some() {
            let drawing = feeds.iter().filter(|f| f.last).count();
            self.make_room(drawing, 0, None);
        }
        let mut pool_room = self.pool.map(|p| p.saturating_sub(self.held()));
        for Feed { slot: i, tokens, last, snapshots, takens, .. } in feeds {
            let st = &mut self.slots[i];
            let from = st.slot.tokens.len();
            st.slot.tokens.extend_from_slice(&tokens);
            let a = st.active.as_mut().expect("a fed slot is busy");
            for (snap, taken) in snapshots.into_iter().zip(takens) {
                let held = &st.slot.tokens[..from + snap.at];
                st.checkpoints.insert(held, snap.states, taken, &self.checkpoints);
                a.plan.remove(0);
            }
            if let Some(&(_, taken)) = a.plan.first().filter(|&&(at, _)| at == st.slot.tokens.len()) {
                a.plan.remove(0);
                if let Err(e) = st.slot.session.take_states_back(&self.model) {
                    // The device that held the states failed: so did the slot.
                    st.active = None;
                    st.forget();
                    events.push((i, SlotEvent::Failed(e)));
                    continue;
                }
                st.checkpoints.take(&st.slot.session.cache, &st.slot.tokens, taken, &self.checkpoints);
            }
            if !last {
                continue;
            }
            let a = st.active.as_mut().expect("a fed slot is busy");
            let ctx_full = st.slot.session.len() >= st.slot.session.cache.n_ctx() || pool_room == Some(0);
            match a.draws.draw(&self.model, st.slot.session.logits_mut(), ctx_full) {
                Err(e) => {
                    // This request's grammar failed; the slot keeps its cache.
                    st.active = None;
                    st.last_used = self.steps;
                    events.push((i, SlotEvent::Failed(e)));
                }
                Ok(Some(step)) => {
                    if step.stop.is_some() {
                        st.active = None;
                        st.last_used = self.steps;
                        events.push((i, SlotEvent::Step(step)));
                        continue;
                    }
                    let room = st.slot.session.cache.n_ctx().saturating_sub(st.slot.session.len() + 1).min(chunk - 1);
                    let room = pool_room.map_or(room, |r| room.min(r.saturating_sub(1)));
                    let forced = match a.draws.forced_steps(&self.model, room) {
                        Ok(f) => f,
                        Err(e) => {
                            st.active = None;
                            st.last_used = self.steps;
                            events.push((i, SlotEvent::Failed(e)));
                            continue;
                        }
                    };
                    a.pending.push(step.token);
                    a.pending.extend(forced.iter().map(|s| s.token));
                    if let Some(r) = pool_room.as_mut() {
                        *r = r.saturating_sub(a.pending.len());
                    }
                    events.push((i, SlotEvent::Step(step)));
                    if forced.last().is_some_and(|s| s.stop.is_some()) {
                        st.active = None;
                        st.last_used = self.steps;
                    }
                    events.extend(forced.into_iter().map(|s| (i, SlotEvent::Step(s))));
                }
                Ok(None) => {
                    // max_tokens 0: the prompt was read, nothing is drawn.
                    st.active = None;
                    st.last_used = self.steps;
                    events.push((i, SlotEvent::Done));
                }
            }
        }
        events
    }
}
