//! The grammar as a byte-level pushdown automaton.
//!
//! A parse in progress is a stack of return positions whose top points at a
//! byte range still to be read. A grammar may be ambiguous, so a state is the
//! *set* of live stacks (as llama.cpp's grammar keeps them). Stacks are
//! hash-consed into frames `(position, parent)`, so a stack is one integer,
//! and states are interned sets of stacks, so a state is one integer too:
//! the transition `(state, byte) -> state` is then a table lookup once seen,
//! and a token mask can be cached per state (see [`crate::mask`]).
//!
//! A call in tail position (the last element of an alternative) pushes no
//! frame, so `r ::= x r |` repeats without growing the stack.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::grammar::{Elem, Grammar};
use crate::mask::{self, TokenIndex, TokenMask};
use crate::GrammarError;

/// A state of one automaton: an interned set of live parses.
pub type StateId = u32;

/// No parse survives.
pub(crate) const DEAD: StateId = u32::MAX;
/// Not computed yet (in the transition tables).
const UNKNOWN: StateId = u32::MAX - 1;
/// The empty stack: the root rule is complete.
const NIL: u32 = u32::MAX;

/// Parses alive at once before the grammar is declared too ambiguous.
pub const MAX_STACKS: usize = 4096;
/// Steps of one expansion (a call entered, an alternative ended) before the
/// grammar is declared too ambiguous: far above what any parse of a sane
/// grammar takes between two bytes.
const MAX_EXPANSION: usize = MAX_STACKS * 64;
/// Distinct states kept before the automaton refuses to go on.
pub const MAX_STATES: usize = 1 << 20;
/// Bytes of token masks cached per automaton, beyond which the cache starts
/// over: 512 masks over a 262,144-token vocabulary, a few thousand over a
/// small one. A server keeps dozens of compiled grammars, so this bounds
/// their memory too.
const MAX_MASK_BYTES: usize = 16 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Bytes(u8, u8),
    Call(u32),
    /// The end of an alternative: return to the frame below.
    Ret,
}

/// The grammar flattened: each alternative is a run of ops ending in `Ret`.
pub(crate) struct Program {
    ops: Vec<Op>,
    /// Start of each alternative, per rule.
    alts: Vec<Vec<u32>>,
    root: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Frame {
    /// The op to resume at: a `Bytes` on top of a stack, anything below it.
    pos: u32,
    /// The frame below, or `NIL`.
    parent: u32,
}

struct StateData {
    /// Live stacks (frame ids whose op is `Bytes`), sorted.
    heads: Box<[u32]>,
    /// Some parse has completed the root.
    accepting: bool,
    /// Transitions by byte, filled as they are needed.
    next: Option<Box<[StateId; 256]>>,
}

/// The tables that grow as the automaton is explored.
pub(crate) struct Tables {
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    states: Vec<StateData>,
    state_ids: HashMap<(Box<[u32]>, bool), StateId>,
    masks: HashMap<(u64, StateId), Arc<TokenMask>>,
}

/// A compiled grammar. Cheap to share: every matcher over it uses (and
/// fills) the same transition tables and mask cache, so a schema used by
/// many requests pays for its masks once.
pub struct Automaton {
    prog: Program,
    tables: Mutex<Tables>,
    start: StateId,
}

impl Automaton {
    pub fn new(grammar: &Grammar) -> Result<Automaton, GrammarError> {
        check_left_recursion(grammar)?;
        let mut ops = Vec::new();
        let mut alts = Vec::with_capacity(grammar.rules.len());
        for rule in &grammar.rules {
            let mut starts = Vec::with_capacity(rule.alts.len());
            for alt in &rule.alts {
                starts.push(ops.len() as u32);
                ops.extend(alt.iter().map(|e| match *e {
                    Elem::Bytes(lo, hi) => Op::Bytes(lo, hi),
                    Elem::Rule(r) => Op::Call(r),
                }));
                ops.push(Op::Ret);
            }
            alts.push(starts);
        }
        let prog = Program { ops, alts, root: grammar.root };
        let mut tables = Tables {
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            states: Vec::new(),
            state_ids: HashMap::new(),
            masks: HashMap::new(),
        };
        let mut heads = Vec::new();
        let mut accepting = false;
        for &a in &prog.alts[prog.root as usize] {
            expand(&prog, &mut tables, a, NIL, &mut heads, &mut accepting)?;
        }
        let start = tables.intern(heads, accepting)?;
        Ok(Automaton { prog, tables: Mutex::new(tables), start })
    }

    pub fn from_gbnf(text: &str) -> Result<Automaton, GrammarError> {
        Automaton::new(&crate::gbnf::parse(text)?)
    }

    pub fn start(&self) -> StateId {
        self.start
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        // A panic while the tables were held leaves them consistent (every
        // insert is complete before it is visible), so poisoning is ignored.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state after reading `bytes` from `state`; `DEAD` if no parse survives.
    pub fn advance(&self, state: StateId, bytes: &[u8]) -> Result<StateId, GrammarError> {
        let mut t = self.tables();
        let mut s = state;
        for &b in bytes {
            if s == DEAD {
                break;
            }
            s = t.step(&self.prog, s, b)?;
        }
        Ok(s)
    }

    /// Whether the root is complete in `state` (the document may end here).
    pub fn is_accepting(&self, state: StateId) -> bool {
        state != DEAD && self.tables().states[state as usize].accepting
    }

    /// Whether `state` can read no further byte (the document must end here).
    pub fn is_final(&self, state: StateId) -> bool {
        state == DEAD || self.tables().states[state as usize].heads.is_empty()
    }

    /// Whether `bytes` is a whole document of the grammar.
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        matches!(self.advance(self.start, bytes), Ok(s) if self.is_accepting(s))
    }

    /// The tokens of `index` that `state` can read whole (control tokens and
    /// the end of the turn are the caller's: they have no bytes). Cached per
    /// state and index.
    pub fn mask(&self, state: StateId, index: &TokenIndex) -> Result<Arc<TokenMask>, GrammarError> {
        let mut t = self.tables();
        if let Some(m) = t.masks.get(&(index.id(), state)) {
            return Ok(m.clone());
        }
        let m = Arc::new(mask::compute(index, state, |s, b| t.step(&self.prog, s, b))?);
        if (t.masks.len() + 1) * m.bytes() > MAX_MASK_BYTES {
            t.masks.clear();
        }
        t.masks.insert((index.id(), state), m.clone());
        Ok(m)
    }

    /// How many states have been explored (for tests and benchmarks).
    pub fn n_states(&self) -> usize {
        self.tables().states.len()
    }
}

impl std::fmt::Debug for Automaton {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Automaton").field("rules", &self.prog.alts.len()).field("states", &self.n_states()).finish()
    }
}

impl Tables {
    fn frame(&mut self, f: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&f) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(f);
        self.frame_ids.insert(f, id);
        id
    }

    fn intern(&mut self, mut heads: Vec<u32>, accepting: bool) -> Result<StateId, GrammarError> {
        if heads.is_empty() && !accepting {
            return Ok(DEAD);
        }
        heads.sort_unstable();
        heads.dedup();
        if heads.len() > MAX_STACKS {
            return Err(GrammarError::TooAmbiguous(MAX_STACKS));
        }
        let key = (heads.into_boxed_slice(), accepting);
        if let Some(&id) = self.state_ids.get(&key) {
            return Ok(id);
        }
        if self.states.len() >= MAX_STATES {
            return Err(GrammarError::TooManyStates(MAX_STATES));
        }
        let id = self.states.len() as StateId;
        self.states.push(StateData { heads: key.0.clone(), accepting, next: None });
        self.state_ids.insert(key, id);
        Ok(id)
    }

    /// One byte from `state`, through the transition table.
    pub(crate) fn step(&mut self, prog: &Program, state: StateId, byte: u8) -> Result<StateId, GrammarError> {
        if let Some(next) = &self.states[state as usize].next {
            let s = next[byte as usize];
            if s != UNKNOWN {
                return Ok(s);
            }
        }
        let mut heads = Vec::new();
        let mut accepting = false;
        for i in 0..self.states[state as usize].heads.len() {
            let f = self.frames[self.states[state as usize].heads[i] as usize];
            if let Op::Bytes(lo, hi) = prog.ops[f.pos as usize] {
                if (lo..=hi).contains(&byte) {
                    expand(prog, self, f.pos + 1, f.parent, &mut heads, &mut accepting)?;
                }
            }
        }
        let s = self.intern(heads, accepting)?;
        let next = self.states[state as usize].next.get_or_insert_with(|| Box::new([UNKNOWN; 256]));
        next[byte as usize] = s;
        Ok(s)
    }
}

/// Pushes every stack that resuming at `pos` over `parent` leads to, down to
/// the next byte each must read; sets `accepting` if one completes the root.
///
/// Iterative, with a bound on the work: nested optional rules (`((x?){0,n}){0,m}`)
/// make the paths through empty alternatives as deep as the nesting and as
/// many as its product, which neither the thread's stack nor a request's
/// time may pay for.
fn expand(
    prog: &Program,
    t: &mut Tables,
    pos: u32,
    parent: u32,
    heads: &mut Vec<u32>,
    accepting: &mut bool,
) -> Result<(), GrammarError> {
    let mut todo = vec![(pos, parent)];
    let mut steps = 0usize;
    while let Some((pos, parent)) = todo.pop() {
        steps += 1;
        if steps > MAX_EXPANSION {
            return Err(GrammarError::TooAmbiguous(MAX_STACKS));
        }
        match prog.ops[pos as usize] {
            Op::Bytes(..) => {
                heads.push(t.frame(Frame { pos, parent }));
                if heads.len() > MAX_STACKS * 4 {
                    return Err(GrammarError::TooAmbiguous(MAX_STACKS));
                }
            }
            Op::Ret if parent == NIL => *accepting = true,
            Op::Ret => {
                let f = t.frames[parent as usize];
                todo.push((f.pos, f.parent));
            }
            Op::Call(r) => {
                // A call in tail position returns straight to our caller.
                let ret = if prog.ops[pos as usize + 1] == Op::Ret { parent } else { t.frame(Frame { pos: pos + 1, parent }) };
                // Reversed onto the stack, so the alternatives are explored in order.
                todo.extend(prog.alts[r as usize].iter().rev().map(|&a| (a, ret)));
            }
        }
    }
    Ok(())
}

/// Refuses a rule that can call itself before reading a byte: expanding it
/// would never end. Includes `x*` of an `x` that can match nothing.
fn check_left_recursion(g: &Grammar) -> Result<(), GrammarError> {
    let n = g.rules.len();
    // Which rules can match the empty string, to a fixed point.
    let mut nullable = vec![false; n];
    loop {
        let mut changed = false;
        for (i, r) in g.rules.iter().enumerate() {
            if !nullable[i] && r.alts.iter().any(|alt| alt.iter().all(|e| matches!(e, Elem::Rule(s) if nullable[*s as usize]))) {
                nullable[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Edges to the rules each can call before reading a byte.
    let leading: Vec<Vec<u32>> = g
        .rules
        .iter()
        .map(|r| {
            let mut out = Vec::new();
            for alt in &r.alts {
                for e in alt {
                    match *e {
                        Elem::Rule(s) => {
                            out.push(s);
                            if !nullable[s as usize] {
                                break;
                            }
                        }
                        Elem::Bytes(..) => break,
                    }
                }
            }
            out
        })
        .collect();
    // Depth-first search for a cycle (iterative: grammars can be deep).
    let mut color = vec![0u8; n]; // 0 unseen, 1 on the path, 2 done
    for root in 0..n {
        if color[root] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        color[root] = 1;
        while let Some(&mut (r, ref mut i)) = stack.last_mut() {
            if let Some(&s) = leading[r].get(*i) {
                *i += 1;
                match color[s as usize] {
                    0 => {
                        color[s as usize] = 1;
                        stack.push((s as usize, 0));
                    }
                    1 => return Err(GrammarError::LeftRecursion(g.rules[s as usize].name.clone())),
                    _ => {}
                }
            } else {
                color[r] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}

/// One generation's position in an automaton.
#[derive(Clone)]
pub struct Matcher {
    automaton: Arc<Automaton>,
    state: StateId,
}

impl Matcher {
    pub fn new(automaton: Arc<Automaton>) -> Matcher {
        let state = automaton.start();
        Matcher { automaton, state }
    }

    pub fn automaton(&self) -> &Arc<Automaton> {
        &self.automaton
    }

    pub fn state(&self) -> StateId {
        self.state
    }

    /// Reads `bytes`; false (and the state left unchanged) if the grammar
    /// refuses them.
    pub fn advance(&mut self, bytes: &[u8]) -> Result<bool, GrammarError> {
        let s = self.automaton.advance(self.state, bytes)?;
        if s == DEAD {
            return Ok(false);
        }
        self.state = s;
        Ok(true)
    }

    /// The document may end here.
    pub fn is_accepting(&self) -> bool {
        self.automaton.is_accepting(self.state)
    }

    /// The document must end here: no byte can follow.
    pub fn is_final(&self) -> bool {
        self.automaton.is_final(self.state)
    }

    pub fn mask(&self, index: &TokenIndex) -> Result<Arc<TokenMask>, GrammarError> {
        self.automaton.mask(self.state, index)
    }

    /// The bytes every continuation must start with (empty when there is a
    /// choice, or the document may end here).
    pub fn forced_bytes(&self, limit: usize) -> Result<Vec<u8>, GrammarError> {
        let a = &self.automaton;
        let mut out = Vec::new();
        let mut s = self.state;
        while out.len() < limit && !a.is_accepting(s) {
            let mut only = None;
            for b in 0..=255u8 {
                if a.advance(s, &[b])? != DEAD {
                    if only.is_some() {
                        return Ok(out);
                    }
                    only = Some(b);
                }
            }
            let Some(b) = only else { break };
            out.push(b);
            s = a.advance(s, &[b])?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(g: &str) -> Automaton {
        Automaton::from_gbnf(g).unwrap()
    }

    #[test]
    fn literals_alternatives_and_classes() {
        let g = a(r#"root ::= "ab" | [x-z]+ "!" | "é""#);
        for ok in ["ab", "x!", "zyx!", "é"] {
            assert!(g.accepts(ok.as_bytes()), "{ok}");
        }
        for bad in ["", "a", "abc", "!", "w!", "e", "x"] {
            assert!(!g.accepts(bad.as_bytes()), "{bad}");
        }
        // Half a multi-byte character is a live prefix, not a document.
        let s = g.advance(g.start(), &"é".as_bytes()[..1]).unwrap();
        assert!(s != DEAD && !g.is_accepting(s));
    }

    #[test]
    fn negated_class_and_any_read_utf8() {
        let g = a(r#"root ::= "\"" [^"\\]* "\"" ."#);
        assert!(g.accepts("\"héllo 😀\"x".as_bytes()));
        assert!(g.accepts("\"\"😀".as_bytes()));
        assert!(!g.accepts(b"\"a\\\"x"));
        // Not UTF-8: a lone continuation byte is no character.
        assert!(!g.accepts(b"\"\x80\"x"));
    }

    #[test]
    fn bounded_repetition() {
        let g = a(r#"root ::= "a"{2,4} "b"{3} ("c" "d"){1,}"#);
        assert!(g.accepts(b"aabbbcd"));
        assert!(g.accepts(b"aaaabbbcdcd"));
        assert!(!g.accepts(b"abbbcd"));
        assert!(!g.accepts(b"aaaaabbbcd"));
        assert!(!g.accepts(b"aabbcd"));
        assert!(!g.accepts(b"aabbb"));
        let opt = a(r#"root ::= "x" "y"? "z"{0,2}"#);
        for ok in ["x", "xy", "xz", "xyzz"] {
            assert!(opt.accepts(ok.as_bytes()), "{ok}");
        }
        assert!(!opt.accepts(b"xzzz"));
    }

    #[test]
    fn tail_recursion_keeps_one_state() {
        let g = a(r#"root ::= [a-z]* "." "#);
        let s1 = g.advance(g.start(), b"a").unwrap();
        let s2 = g.advance(s1, b"bcdefg").unwrap();
        assert_eq!(s1, s2, "a long run of the same repetition is one state");
    }

    #[test]
    fn nested_recursion() {
        let g = a(r#"root ::= list
list ::= "[" (item ("," item)*)? "]"
item ::= [0-9]+ | list"#);
        assert!(g.accepts(b"[]"));
        assert!(g.accepts(b"[1,[2,[[]],3],45]"));
        assert!(!g.accepts(b"[1,]"));
        assert!(!g.accepts(b"[[1]"));
    }

    #[test]
    fn left_recursion_is_refused() {
        for g in ["root ::= root \"a\" | \"b\"", "root ::= x\nx ::= \"\"? root", "root ::= (\"a\"?)*"] {
            assert!(matches!(Automaton::from_gbnf(g), Err(GrammarError::LeftRecursion(_))), "{g}");
        }
        // Right recursion and recursion after a byte are fine.
        assert!(Automaton::from_gbnf("root ::= \"a\" root | \"b\"").is_ok());
    }

    #[test]
    fn final_and_forced() {
        let g = Arc::new(a(r#"root ::= "{\"name\": " ("1" | "22")"#));
        let mut m = Matcher::new(g.clone());
        assert_eq!(m.forced_bytes(100).unwrap(), b"{\"name\": ");
        assert!(m.advance(b"{\"name\": 2").unwrap());
        assert_eq!(m.forced_bytes(100).unwrap(), b"2");
        assert!(!m.advance(b"3").unwrap());
        assert!(m.advance(b"2").unwrap());
        assert!(m.is_accepting() && m.is_final());
    }

    #[test]
    fn ambiguity_merges_equal_parses() {
        // Both alternatives read "ab" and then the same rest: one state each step.
        let g = a(r#"root ::= ("a" "b" | "ab") "c"*"#);
        assert!(g.accepts(b"abccc"));
        let s = g.advance(g.start(), b"ab").unwrap();
        assert!(g.is_accepting(s));
    }
}
