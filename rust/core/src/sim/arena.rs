//! The live requests, in slots reused once a request is finished and released, so memory
//! follows the number in flight, not the trace length.

use super::request::{ReqIdx, SimRequest};

#[derive(Debug, Default)]
pub struct Requests {
    slots: Vec<Option<SimRequest>>,
    free: Vec<ReqIdx>,
}

impl Requests {
    pub fn insert(&mut self, request: SimRequest) -> ReqIdx {
        match self.free.pop() {
            Some(idx) => {
                self.slots[idx as usize] = Some(request);
                idx
            }
            None => {
                self.slots.push(Some(request));
                (self.slots.len() - 1) as ReqIdx
            }
        }
    }

    pub fn remove(&mut self, idx: ReqIdx) -> SimRequest {
        let request = self.slots[idx as usize]
            .take()
            .expect("removing a live request");
        self.free.push(idx);
        request
    }

    pub fn get(&self, idx: ReqIdx) -> &SimRequest {
        self.slots[idx as usize].as_ref().expect("a live request")
    }

    pub fn get_mut(&mut self, idx: ReqIdx) -> &mut SimRequest {
        self.slots[idx as usize].as_mut().expect("a live request")
    }

    /// The live request in the lowest slot, if any.
    pub fn first_live(&self) -> Option<&SimRequest> {
        self.slots.iter().flatten().next()
    }

    pub fn num_live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}
