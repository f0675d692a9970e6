//! Rarely set fields of a record, in one optional box.
//!
//! A dependency's predicate, description and flags, an item's label and
//! description: nearly always empty or false, yet a deep graph holds
//! millions of them. [`RareTexts`] is one pointer while all are unset and
//! allocates only when one is set.

/// Two texts, `first` and `second`, and a small `Copy` payload `F` (flags),
/// boxed together only while a text is set or `F` is not its default.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct RareTexts<F = ()>(Option<Box<Rare<F>>>);

#[derive(Clone, Debug, Default, PartialEq)]
struct Rare<F> {
    texts: [Box<str>; 2],
    flags: F,
}

impl<F> Default for RareTexts<F> {
    fn default() -> Self {
        Self(None)
    }
}

impl<F: Copy + Default + PartialEq> RareTexts<F> {
    /// The first text ("" when unset).
    pub(super) fn first(&self) -> &str {
        self.text(0)
    }

    /// The second text ("" when unset).
    pub(super) fn second(&self) -> &str {
        self.text(1)
    }

    /// The flags (their default when unset).
    pub(super) fn flags(&self) -> F {
        self.0.as_ref().map_or_else(F::default, |rare| rare.flags)
    }

    /// Sets the first text (empty: unset).
    pub(super) fn set_first(&mut self, text: impl Into<Box<str>>) {
        self.set_text(0, text.into());
    }

    /// Sets the second text (empty: unset).
    pub(super) fn set_second(&mut self, text: impl Into<Box<str>>) {
        self.set_text(1, text.into());
    }

    /// Sets the flags (the default: unset).
    pub(super) fn set_flags(&mut self, flags: F) {
        if self.0.is_none() && flags == F::default() {
            return;
        }
        self.rare().flags = flags;
        self.drop_when_unset();
    }

    /// Whether a box is allocated (a text or a flag is set).
    #[cfg(test)]
    pub(super) fn is_boxed(&self) -> bool {
        self.0.is_some()
    }

    fn text(&self, index: usize) -> &str {
        self.0.as_ref().map_or("", |rare| &rare.texts[index])
    }

    fn set_text(&mut self, index: usize, text: Box<str>) {
        // Decoding sets every text, nearly all empty: no allocation.
        if self.0.is_none() && text.is_empty() {
            return;
        }
        self.rare().texts[index] = text;
        self.drop_when_unset();
    }

    fn rare(&mut self) -> &mut Rare<F> {
        self.0.get_or_insert_with(|| {
            Box::new(Rare {
                texts: Default::default(),
                flags: F::default(),
            })
        })
    }

    fn drop_when_unset(&mut self) {
        let unset = self.0.as_ref().is_some_and(|rare| {
            rare.flags == F::default() && rare.texts.iter().all(|text| text.is_empty())
        });
        if unset {
            self.0 = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_boxed_only_while_one_is_set() {
        let mut texts = RareTexts::<()>::default();
        texts.set_first("");
        texts.set_second("");
        assert!(!texts.is_boxed());
        texts.set_second("why");
        assert!(texts.is_boxed());
        assert_eq!((texts.first(), texts.second()), ("", "why"));
        texts.set_first("self.up");
        texts.set_second("");
        assert_eq!((texts.first(), texts.second()), ("self.up", ""));
        texts.set_first(String::new());
        assert!(!texts.is_boxed());
        assert_eq!(texts, RareTexts::default());
    }

    #[test]
    fn flags_are_boxed_only_while_set_or_beside_a_text() {
        let mut rare = RareTexts::<bool>::default();
        rare.set_flags(false);
        assert!(!rare.is_boxed());
        rare.set_flags(true);
        assert!(rare.is_boxed());
        assert!(rare.flags());
        rare.set_first("self.up");
        rare.set_flags(false);
        assert!(rare.is_boxed(), "the text still needs the box");
        assert_eq!((rare.first(), rare.flags()), ("self.up", false));
        rare.set_first("");
        assert!(!rare.is_boxed());
        assert_eq!(rare, RareTexts::default());
    }
}
