-- resident.chat: :ResidentChat, a buffer holding one session.
--
-- The buffer shows the session's id and its turns under "## user" and
-- "## assistant" headings. The user writes below the last "## user" (an
-- extmark holds that line, so edits above do not move it) and sends with
-- chat_send_key; the reply streams in below, then a new "## user" follows.
-- The daemon keeps the history: only the new turn is sent, with the session.
-- A new chat's session is made when its first message is sent, so that a
-- chat opened and left unused leaves no empty session behind.
local resident = require('resident')

local M = {}

local ns = vim.api.nvim_create_namespace('resident-chat')
-- bufnr -> { session = uuid (nil until the first message), model, system, titled,
--           mark = extmark of the pending "## user", gen = request id (or 'session.new') or nil }
local chats = {}
local new_chats = 0 -- names resident://chat/new-N apart until their sessions exist

local function buf_name(uuid)
  return 'resident://chat/' .. uuid
end

-- The first line: the session's id, or for a new chat that it has none yet.
local function heading(uuid)
  return uuid and ('# session ' .. uuid) or '# new session (made when the first message is sent)'
end

local function split(text)
  return vim.split(text, '\n', { plain = true })
end

-- Lines of the session's header and history, ending with the "## user" to write under.
local function render(s, turns)
  local lines = { heading(s.session), string.format('model %s%s', s.model,
    s.title ~= '' and (', ' .. s.title) or ''), '' }
  local function section(role, content)
    table.insert(lines, '## ' .. role)
    vim.list_extend(lines, split(content))
    table.insert(lines, '')
  end
  if s.system ~= '' then
    section('system', s.system)
  end
  for _, t in ipairs(turns) do
    section(t.role, t.content)
  end
  vim.list_extend(lines, { '## user', '' })
  return lines
end

-- Marks the second last line (a "## user") as the start of the turn being written.
local function mark_pending(buf, state)
  local row = vim.api.nvim_buf_line_count(buf) - 2
  state.mark = vim.api.nvim_buf_set_extmark(buf, ns, row, 0, { id = state.mark })
end

-- Opens a chat buffer for session s (a session map; without its session, a new chat) with its turns.
local function open_buffer(s, turns)
  if s.session == nil then
    new_chats = new_chats + 1
  end
  local buf = resident.scratch(buf_name(s.session or ('new-' .. new_chats)), 'hide')
  local state = { session = s.session, model = s.model, system = s.system, titled = s.title ~= '' }
  chats[buf] = state
  vim.api.nvim_buf_set_lines(buf, 0, -1, true, render(s, turns))
  if s.session ~= nil then
    vim.api.nvim_buf_set_var(buf, 'resident_session', s.session)
  end
  mark_pending(buf, state)
  local key = resident.options.chat_send_key
  if key then
    vim.keymap.set('n', key, function()
      M.send(buf)
    end, { buffer = buf, desc = 'resident: send the turn' })
  end
  -- a nofile buffer unloaded (:bdelete) has lost its text: it is no chat any more
  vim.api.nvim_create_autocmd({ 'BufUnload', 'BufWipeout' }, { buffer = buf, once = true, callback = function()
    chats[buf] = nil
  end })
  resident.show(buf)
  vim.api.nvim_win_set_cursor(0, { vim.api.nvim_buf_line_count(buf), 0 })
  return buf
end

-- Names a new session after the start of its first message.
local function title(state, text)
  if state.titled then
    return
  end
  state.titled = true
  local t = vim.fn.strcharpart(split(text)[1], 0, 60)
  resident.conn():request({ op = 'session.rename', session = state.session, title = t }, function(r)
    if r.type == 'error' then
      resident.error(r)
    end
  end)
end

-- Makes a new chat's session (its model, its system prompt), then after() once the buffer holds it.
local function make_session(buf, state, after)
  state.gen = 'session.new' -- nothing else is sent meanwhile
  resident.conn():request({ op = 'session.new', model = state.model, system = state.system }, function(r)
    state.gen = nil
    if r.type == 'error' then
      return resident.error(r)
    end
    state.session = r.session.session
    if vim.api.nvim_buf_is_valid(buf) then
      local old = vim.api.nvim_buf_get_name(buf)
      vim.api.nvim_buf_set_name(buf, buf_name(state.session))
      -- renaming leaves a buffer of the old name behind (as :file does)
      local left = vim.fn.bufnr('^' .. old .. '$')
      if left > 0 and left ~= buf then
        vim.api.nvim_buf_delete(left, { force = true })
      end
      vim.api.nvim_buf_set_var(buf, 'resident_session', state.session)
      vim.api.nvim_buf_set_lines(buf, 0, 1, true, { heading(state.session) })
      after()
    end
  end)
end

-- Sends what is written below the last "## user" as the next turn.
function M.send(buf)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local state = chats[buf]
  if state == nil then
    return vim.notify('resident: this is not a chat buffer (:ResidentChat opens one)', vim.log.levels.ERROR)
  end
  if state.gen ~= nil then
    return vim.notify('resident: a reply is still being written (:ResidentStop stops it)', vim.log.levels.WARN)
  end
  local row = vim.api.nvim_buf_get_extmark_by_id(buf, ns, state.mark, {})[1]
  local text = vim.trim(table.concat(vim.api.nvim_buf_get_lines(buf, row + 1, -1, true), '\n'))
  if text == '' then
    return vim.notify('resident: write the message below the last "## user" first', vim.log.levels.WARN)
  end
  if state.session == nil then
    return make_session(buf, state, function()
      M.send(buf)
    end)
  end
  local lines = split(text)
  vim.list_extend(lines, { '', '## assistant', '' })
  vim.api.nvim_buf_set_lines(buf, row + 1, -1, true, lines)
  local fields = { session = state.session, messages = { { role = 'user', content = text } } }
  state.gen = resident.stream(buf, resident.sampling(fields), function(r, valid)
    state.gen = nil
    if not valid then
      return
    end
    if r.type == 'done' and r.finish ~= 'cancel' then
      title(state, text)
      resident.append(buf, '\n\n## user\n')
    else
      -- PROTOCOL.md: a cancelled or failed turn leaves the session as it was
      resident.append(buf, '\n\n(not saved: the reply did not finish)\n\n## user\n')
    end
    mark_pending(buf, state)
  end)
end

-- Opens an existing session's buffer, or reads the session and makes one.
local function resume(uuid)
  local buf = vim.fn.bufnr('^' .. buf_name(uuid) .. '$')
  if buf > 0 and chats[buf] ~= nil then
    local win = vim.fn.bufwinid(buf)
    if win ~= -1 then
      vim.api.nvim_set_current_win(win)
    else
      resident.show(buf)
    end
    return
  elseif buf > 0 then
    vim.api.nvim_buf_delete(buf, { force = true }) -- unloaded, its name is still taken
  end
  resident.conn():request({ op = 'session.get', session = uuid }, function(r)
    if r.type == 'error' then
      return resident.error(r)
    end
    open_buffer(r.session, r.turns)
  end)
end

-- :ResidentChat [session]: a new chat, or the session named. A new chat's
-- model is asked for first (model.show), so that an unknown one, or a
-- daemon that is not running, is told at once and the buffer names it.
function M.open(uuid)
  if uuid ~= nil and uuid ~= '' then
    return resume(uuid)
  end
  local o = resident.options
  resident.conn():request({ op = 'model.show', model = o.model }, function(r)
    if r.type == 'error' then
      return resident.error(r)
    end
    open_buffer({ model = r.model.name, system = o.system or '', title = '' }, {})
  end)
end

-- Completion of :ResidentChat: the user's sessions, most recent first.
function M.complete(lead)
  local ids, done = {}, false
  resident.conn():request({ op = 'session.list', limit = 200 }, function(r)
    for _, s in ipairs(r.type == 'result' and r.sessions or {}) do
      if vim.startswith(s.session, lead) then
        table.insert(ids, s.session)
      end
    end
    done = true
  end)
  vim.wait(2000, function()
    return done
  end)
  return ids
end

return M
