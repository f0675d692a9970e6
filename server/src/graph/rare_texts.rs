//! Two rarely set texts of a record, in one optional box.
//!
//! A dependency's predicate and description, an item's label and
//! description: nearly always empty, yet a deep graph holds millions of
//! them. [`RareTexts`] is one pointer while both are empty and allocates
//! only when one is set.

/// Two texts, `first` and `second`, boxed together only while one is set.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct RareTexts(Option<Box<[Box<str>; 2]>>);

impl RareTexts {
    /// The first text ("" when unset).
    pub(super) fn first(&self) -> &str {
        self.get(0)
    }

    /// The second text ("" when unset).
    pub(super) fn second(&self) -> &str {
        self.get(1)
    }

    /// Sets the first text (empty: unset).
    pub(super) fn set_first(&mut self, text: impl Into<Box<str>>) {
        self.set(0, text.into());
    }

    /// Sets the second text (empty: unset).
    pub(super) fn set_second(&mut self, text: impl Into<Box<str>>) {
        self.set(1, text.into());
    }

    /// Whether a box is allocated (one of the texts is set).
    #[cfg(test)]
    pub(super) fn is_boxed(&self) -> bool {
        self.0.is_some()
    }

    fn get(&self, index: usize) -> &str {
        self.0.as_ref().map_or("", |texts| &texts[index])
    }

    fn set(&mut self, index: usize, text: Box<str>) {
        match &mut self.0 {
            // Decoding sets every text, nearly all empty: no allocation.
            None if text.is_empty() => {}
            None => {
                let mut texts: [Box<str>; 2] = Default::default();
                texts[index] = text;
                self.0 = Some(Box::new(texts));
            }
            Some(texts) => {
                texts[index] = text;
                if texts.iter().all(|text| text.is_empty()) {
                    self.0 = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_boxed_only_while_one_is_set() {
        let mut texts = RareTexts::default();
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
}
