//! No import circles in the core: the graph of `tidings-core`'s modules, built from its source,
//! has no cycle (docs/architecture.md, "No import circles in the core").
//!
//! Each module is a node: a file, or an inline `mod`; a `mod.rs` (and `lib.rs`) is the node of
//! the items written in it, so `timers` means what `timers/mod.rs` holds. An edge goes from a
//! module to the deepest module a path names, in non-test code (`#[cfg(test)]` items and `tests`
//! modules are skipped):
//! - a `use` of an item (`use crate::a::b::Item`, `use super::b::{self, Item}`, a glob), a
//!   re-export (`pub use`) of an item or a module;
//! - a path in code or in a macro's tokens (`crate::a::b::f()`, `super::b::T`, `b::f()` through a
//!   `use` of the module `b`).
//!
//! A name a module re-exports is followed to the module that defines it, so a facade `mod.rs`
//! that only re-exports its children is no circle with them; a `mod.rs` that defines an item its
//! child uses and uses one of its child's items is. A parent's `mod child;` is containment, not
//! an edge. A strongly connected component of more than one module is a circle, printed as
//! `a -> b -> a` with the paths that make each edge.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// A module's path from the crate root (`[]` is the crate root).
type ModPath = Vec<String>;

/// A `use` as written: a name (or a glob, or `as _`) bound to one path.
#[derive(Debug, Clone)]
struct UseOf {
    name: Option<String>,
    /// The path as written, relative to the module (`crate::…`, `super::…`, `child::…`).
    target: Vec<String>,
    /// `pub`, `pub(crate)`, …: reachable from other modules, so a re-export.
    public: bool,
    glob: bool,
}

#[derive(Debug, Default)]
struct Module {
    children: BTreeSet<String>,
    /// The names the module's `use`s bind, to their paths as written.
    bindings: BTreeMap<String, Vec<String>>,
    uses: Vec<UseOf>,
    /// Paths in code (types, expressions, patterns, macro paths and tokens), as written.
    paths: Vec<Vec<String>>,
}

/// The modules of a crate, read through `read` (a file's text by its path under `src/`).
struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

/// Where a path lands: a module named in full, or an item of a module.
#[derive(Debug, PartialEq)]
enum Target {
    Module(ModPath),
    Item(ModPath),
}

impl Target {
    fn module(self) -> ModPath {
        match self {
            Target::Module(m) | Target::Item(m) => m,
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let syn::Meta::List(list) = &a.meta else { return false };
        let tokens: Vec<TokenTree> = list.tokens.clone().into_iter().collect();
        match tokens.as_slice() {
            [TokenTree::Ident(i)] => i == "test",
            [TokenTree::Ident(all), TokenTree::Group(g)] if all == "all" => {
                g.stream().into_iter().any(|t| matches!(t, TokenTree::Ident(i) if i == "test"))
            }
            _ => false,
        }
    })
}

fn flatten_use(tree: &syn::UseTree, prefix: &mut Vec<String>, public: bool, out: &mut Vec<UseOf>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, public, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let (name, target) = if n.ident == "self" {
                (prefix.last().cloned(), prefix.clone())
            } else {
                let mut t = prefix.clone();
                t.push(n.ident.to_string());
                (Some(n.ident.to_string()), t)
            };
            out.push(UseOf { name, target, public, glob: false });
        }
        syn::UseTree::Rename(r) => {
            let mut target = prefix.clone();
            if r.ident != "self" {
                target.push(r.ident.to_string());
            }
            let name = (r.rename != "_").then(|| r.rename.to_string());
            out.push(UseOf { name, target, public, glob: false });
        }
        syn::UseTree::Glob(_) => out.push(UseOf { name: None, target: prefix.clone(), public, glob: true }),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, public, out);
            }
        }
    }
}

/// Paths `a::b::c` in a macro's tokens (a macro's arguments are not parsed as code).
fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tts.len() {
        match &tts[i] {
            TokenTree::Group(g) => {
                token_paths(g.stream(), out);
                i += 1;
            }
            TokenTree::Ident(first) => {
                let mut segs = vec![first.to_string()];
                let mut j = i + 1;
                while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(TokenTree::Ident(next))) =
                    (tts.get(j), tts.get(j + 1), tts.get(j + 2))
                {
                    if a.as_char() != ':' || a.spacing() != Spacing::Joint || b.as_char() != ':' {
                        break;
                    }
                    segs.push(next.to_string());
                    j += 3;
                }
                if segs.len() > 1 {
                    out.push(segs);
                }
                i = j;
            }
            _ => i += 1,
        }
    }
}

/// Collects one module's uses and paths, stopping at nested modules (nodes of their own) and at
/// test-only items.
struct Collector<'a> {
    module: &'a mut Module,
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        match item {
            syn::Item::Mod(_) => {}
            syn::Item::Use(u) => {
                if is_test_only(&u.attrs) || u.leading_colon.is_some() {
                    return;
                }
                let public = !matches!(u.vis, syn::Visibility::Inherited);
                flatten_use(&u.tree, &mut Vec::new(), public, &mut self.module.uses);
            }
            syn::Item::Fn(i) if is_test_only(&i.attrs) => {}
            syn::Item::Impl(i) if is_test_only(&i.attrs) => {}
            syn::Item::Struct(i) if is_test_only(&i.attrs) => {}
            syn::Item::Enum(i) if is_test_only(&i.attrs) => {}
            syn::Item::Const(i) if is_test_only(&i.attrs) => {}
            syn::Item::Static(i) if is_test_only(&i.attrs) => {}
            syn::Item::Trait(i) if is_test_only(&i.attrs) => {}
            syn::Item::Type(i) if is_test_only(&i.attrs) => {}
            syn::Item::Macro(i) if is_test_only(&i.attrs) => {}
            _ => visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(m) => &m.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            self.module.paths.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        token_paths(mac.tokens.clone(), &mut self.module.paths);
        visit::visit_macro(self, mac);
    }

    // Doc comments and attribute arguments are not code.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}

    // `pub(crate)`, `pub(in crate::a)`: who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
}

impl Crate {
    /// Reads the crate from `lib.rs`, following `mod` declarations through `read`.
    fn load(read: &dyn Fn(&Path) -> Option<String>) -> Crate {
        let mut krate = Crate { modules: BTreeMap::new() };
        let root = PathBuf::from("lib.rs");
        let text = read(&root).expect("lib.rs");
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("lib.rs: {e}"));
        krate.load_module(read, Vec::new(), &root, true, &file.items);
        krate
    }

    fn load_module(
        &mut self,
        read: &dyn Fn(&Path) -> Option<String>,
        path: ModPath,
        file: &Path,
        owns_dir: bool,
        items: &[syn::Item],
    ) {
        let mut module = Module::default();
        for item in items {
            Collector { module: &mut module }.visit_item(item);
        }
        // The directory a file module's `mod child;` files are in: `a/` for `a/mod.rs` (or
        // `lib.rs` at the root), `a/b/` for `a/b.rs`.
        let dir =
            if owns_dir { file.parent().map(Path::to_path_buf).unwrap_or_default() } else { file.with_extension("") };
        for item in items {
            let syn::Item::Mod(m) = item else { continue };
            let name = m.ident.to_string();
            if name == "tests" || is_test_only(&m.attrs) {
                continue;
            }
            assert!(
                !m.attrs.iter().any(|a| a.path().is_ident("path")),
                "{}: `#[path]` on `mod {name}` is not followed by this test",
                file.display()
            );
            module.children.insert(name.clone());
            let mut child = path.clone();
            child.push(name.clone());
            match &m.content {
                Some((_, inner)) => self.load_module(read, child, &dir.join(&name), false, inner),
                None => {
                    let flat = dir.join(format!("{name}.rs"));
                    let nested = dir.join(&name).join("mod.rs");
                    let (child_file, text, owns) = match read(&flat) {
                        Some(text) => (flat, text, false),
                        None => {
                            let text = read(&nested).unwrap_or_else(|| panic!("no file for mod {}", child.join("::")));
                            (nested, text, true)
                        }
                    };
                    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", child_file.display()));
                    self.load_module(read, child, &child_file, owns, &parsed.items);
                }
            }
        }
        for u in &module.uses {
            if let (Some(name), false) = (&u.name, u.glob) {
                module.bindings.insert(name.clone(), u.target.clone());
            }
        }
        self.modules.insert(path, module);
    }

    /// The module a path written in `ctx` lands in, or `None` for a path outside the crate (a
    /// dependency, the prelude, a local name, a generic parameter).
    fn resolve(&self, ctx: &[String], segs: &[String], depth: usize) -> Option<Target> {
        if depth > 16 {
            return None;
        }
        let (first, rest) = segs.split_first()?;
        match first.as_str() {
            "crate" => self.walk(Vec::new(), rest, depth),
            "self" => self.walk(ctx.to_vec(), rest, depth),
            "super" => {
                let mut m = ctx.to_vec();
                m.pop()?;
                let mut rest = rest;
                while let Some((s, r)) = rest.split_first()
                    && s == "super"
                {
                    m.pop()?;
                    rest = r;
                }
                self.walk(m, rest, depth)
            }
            _ => {
                let module = self.modules.get(ctx)?;
                if module.children.contains(first) {
                    self.walk(ctx.to_vec(), segs, depth)
                } else if let Some(b) = module.bindings.get(first) {
                    let mut target = b.clone();
                    target.extend_from_slice(rest);
                    self.resolve(ctx, &target, depth + 1)
                } else {
                    None
                }
            }
        }
    }

    fn walk(&self, mut at: ModPath, mut rest: &[String], depth: usize) -> Option<Target> {
        loop {
            let module = self.modules.get(&at)?;
            let Some((s, tail)) = rest.split_first() else { return Some(Target::Module(at)) };
            if module.children.contains(s) {
                at.push(s.clone());
                rest = tail;
            } else if let Some(b) = module.bindings.get(s) {
                // A re-export: followed to where the name is defined. A name re-exported from a
                // dependency is an item of the module that re-exports it.
                let mut target = b.clone();
                target.extend_from_slice(tail);
                return Some(self.resolve(&at, &target, depth + 1).unwrap_or(Target::Item(at)));
            } else {
                return Some(Target::Item(at));
            }
        }
    }

    /// Every edge `from -> to` with the paths (as written) that make it.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), BTreeSet<String>> {
        let mut edges: BTreeMap<(ModPath, ModPath), BTreeSet<String>> = BTreeMap::new();
        for (ctx, module) in &self.modules {
            let mut add = |to: ModPath, via: String| {
                if &to != ctx {
                    edges.entry((ctx.clone(), to)).or_default().insert(via);
                }
            };
            for u in &module.uses {
                let via = format!("use {}{}", u.target.join("::"), if u.glob { "::*" } else { "" });
                match self.resolve(ctx, &u.target, 0) {
                    // A private `use` of a module is an edge where the module's items are used.
                    Some(Target::Module(m)) if u.public || u.glob => add(m, via),
                    Some(Target::Item(m)) => add(m, via),
                    _ => {}
                }
            }
            // A one-segment path is a local name, or one a `use` brought in (its edge is the use's).
            for p in module.paths.iter().filter(|p| p.len() > 1) {
                if let Some(t) = self.resolve(ctx, p, 0) {
                    add(t.module(), p.join("::"));
                }
            }
        }
        edges
    }
}

fn name(m: &[String]) -> String {
    if m.is_empty() { "crate".to_string() } else { m.join("::") }
}

/// Strongly connected components (Tarjan), each sorted.
fn components(nodes: &BTreeSet<ModPath>, next: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct State<'a> {
        next: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on_stack: BTreeSet<ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn connect(s: &mut State<'_>, v: &ModPath) {
        let i = s.index.len();
        s.index.insert(v.clone(), i);
        s.low.insert(v.clone(), i);
        s.stack.push(v.clone());
        s.on_stack.insert(v.clone());
        let next = s.next.get(v).cloned().unwrap_or_default();
        for w in &next {
            if !s.index.contains_key(w) {
                connect(s, w);
                let l = s.low[v].min(s.low[w]);
                s.low.insert(v.clone(), l);
            } else if s.on_stack.contains(w) {
                let l = s.low[v].min(s.index[w]);
                s.low.insert(v.clone(), l);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            comp.sort();
            s.out.push(comp);
        }
    }
    let mut s = State {
        next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !s.index.contains_key(v) {
            connect(&mut s, v);
        }
    }
    s.out
}

/// The circles of a crate: one shortest cycle through each component of more than one module,
/// with the paths of its edges, and the component's other members.
fn circles(krate: &Crate) -> Vec<String> {
    let edges = krate.edges();
    let mut next: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from.clone()).or_default().insert(to.clone());
    }
    let nodes: BTreeSet<ModPath> = krate.modules.keys().cloned().collect();
    let mut out = Vec::new();
    for comp in components(&nodes, &next).into_iter().filter(|c| c.len() > 1) {
        let members: BTreeSet<&ModPath> = comp.iter().collect();
        let start = &comp[0];
        // Breadth-first from `start` back to it, inside the component.
        let mut came_from: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(v) = queue.pop_front() {
            for w in next.get(v).into_iter().flatten() {
                if w == start {
                    last = Some(v);
                    break 'search;
                }
                if members.contains(w) && !came_from.contains_key(w) {
                    came_from.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut back = Vec::new();
        let mut v = last.expect("a component of more than one module has a cycle through each member");
        while v != start {
            back.push(v);
            v = came_from[v];
        }
        let mut cycle = vec![start];
        cycle.extend(back.into_iter().rev());
        cycle.push(start);
        let mut text = cycle.iter().map(|m| name(m)).collect::<Vec<_>>().join(" -> ");
        for pair in cycle.windows(2) {
            let via = &edges[&(pair[0].clone(), pair[1].clone())];
            let via: Vec<&str> = via.iter().map(String::as_str).collect();
            text.push_str(&format!("\n    {} -> {}: {}", name(pair[0]), name(pair[1]), via.join(", ")));
        }
        let on_cycle: BTreeSet<&ModPath> = cycle.iter().copied().collect();
        let others: Vec<String> = comp.iter().filter(|m| !on_cycle.contains(m)).map(|m| name(m)).collect();
        if !others.is_empty() {
            text.push_str(&format!("\n    the same circle also holds {}; its edges:", others.join(", ")));
            for ((a, b), via) in edges.iter().filter(|((a, b), _)| members.contains(a) && members.contains(b)) {
                let via: Vec<&str> = via.iter().map(String::as_str).collect();
                text.push_str(&format!("\n      {} -> {}: {}", name(a), name(b), via.join(", ")));
            }
        }
        out.push(text);
    }
    out
}

#[test]
fn the_core_has_no_import_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let krate = Crate::load(&|p| std::fs::read_to_string(src.join(p)).ok());
    assert!(krate.modules.len() > 20, "the core's modules were not found: {:?}", krate.modules.keys());
    let found = circles(&krate);
    assert!(found.is_empty(), "import circles in tidings-core ({}):\n{}", found.len(), found.join("\n"));
}

fn synthetic(files: &[(&str, &str)]) -> Vec<String> {
    let files: BTreeMap<PathBuf, String> = files.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())).collect();
    circles(&Crate::load(&|p| files.get(p).cloned()))
}

#[test]
fn two_siblings_that_use_each_other_are_a_circle() {
    let found = synthetic(&[
        ("lib.rs", "pub mod notify;"),
        ("notify/mod.rs", "pub mod abuse; pub mod policy;"),
        ("notify/abuse.rs", "use super::policy::Verdict; pub struct Guard;"),
        ("notify/policy.rs", "pub enum Verdict { Send } pub fn check(_: &crate::notify::abuse::Guard) {}"),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("notify::abuse -> notify::policy -> notify::abuse"), "{found:?}");
    assert!(found[0].contains("crate::notify::abuse::Guard"), "{found:?}");
}

#[test]
fn a_parent_and_a_child_that_use_each_others_items_are_a_circle_a_facade_is_not() {
    let facade = synthetic(&[
        ("lib.rs", "pub mod restock; pub mod timers;"),
        ("restock/mod.rs", "pub mod model; pub mod rounds; pub use model::Round; pub use rounds::run;"),
        ("restock/model.rs", "pub struct Round;"),
        ("restock/rounds.rs", "pub fn run(_: crate::restock::Round) {}"),
        ("timers.rs", "pub fn tick() { crate::restock::run(crate::restock::Round) }"),
    ]);
    assert!(facade.is_empty(), "{facade:?}");

    let found = synthetic(&[
        ("lib.rs", "pub mod timers; pub mod restock;"),
        ("timers/mod.rs", "pub mod schedule; pub struct TimerTask; pub fn run() { crate::restock::restock(); }"),
        ("timers/schedule.rs", "pub fn plan() {}"),
        ("restock.rs", "use crate::timers; pub fn restock() { let _ = timers::TimerTask; }"),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("restock -> timers -> restock"), "{found:?}");
}

#[test]
fn test_code_and_macro_tokens_are_read_as_the_compiler_would() {
    // Test-only code is no edge.
    let tests_only = synthetic(&[
        ("lib.rs", "pub mod a; pub mod b;"),
        ("a.rs", "pub fn f() { crate::b::g() }"),
        ("b.rs", "pub fn g() {} #[cfg(test)] mod tests { use crate::a::f; } #[cfg(test)] fn h() { crate::a::f() }"),
    ]);
    assert!(tests_only.is_empty(), "{tests_only:?}");

    // A path inside a macro's arguments is.
    let in_macro = synthetic(&[
        ("lib.rs", "pub mod a; pub mod b;"),
        ("a.rs", "pub fn f() { crate::b::g() }"),
        ("b.rs", "pub fn g() { assert!(matches!(super::a::f(), ())); }"),
    ]);
    assert_eq!(in_macro.len(), 1, "{in_macro:?}");
    assert!(in_macro[0].starts_with("a -> b -> a"), "{in_macro:?}");
}
